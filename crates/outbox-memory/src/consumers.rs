//! [`ConsumerRegistry`] in memory: the registry in the journal's state.

use outbox_core::{
    ConsumerInfo, ConsumerKind, ConsumerRegistry, Result, SinkName, WorkerId, validate_code_version,
};

use crate::MemoryJournal;

impl ConsumerRegistry for MemoryJournal {
    async fn register_consumers(
        &self,
        consumers: &[(SinkName, ConsumerKind)],
        version: &str,
        worker: &WorkerId,
    ) -> Result<()> {
        validate_code_version(version)?;
        let now = self.now();
        let mut st = self.lock();
        for (key, kind) in consumers {
            let (first_seen, paused) = st
                .consumers
                .get(key)
                .map_or((now, false), |c| (c.first_seen, c.paused));
            st.consumers.insert(
                key.clone(),
                ConsumerInfo {
                    key: key.clone(),
                    kind: *kind,
                    version: version.to_owned(),
                    first_seen,
                    last_seen: now,
                    last_worker: worker.clone(),
                    paused,
                },
            );
        }
        Ok(())
    }

    async fn consumers(&self) -> Result<Vec<ConsumerInfo>> {
        Ok(self.lock().consumers.values().cloned().collect())
    }

    async fn set_paused(&self, key: &SinkName, paused: bool) -> Result<bool> {
        let mut st = self.lock();
        let Some(c) = st.consumers.get_mut(key) else {
            return Err(outbox_core::Error::NotFound(format!(
                "no consumer {key} is registered"
            )));
        };
        let changed = c.paused != paused;
        c.paused = paused;
        Ok(changed)
    }

    async fn retire_consumer(&self, key: &SinkName) -> Result<bool> {
        let mut st = self.lock();
        let registered = st.consumers.remove(key).is_some();
        let before = st.sinks.streams.len();
        st.sinks.streams.retain(|(k, _), _| k != key);
        Ok(registered || st.sinks.streams.len() != before)
    }
}
