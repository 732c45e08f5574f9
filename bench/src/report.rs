//! The result rows, the markdown table and the JSON document.

use std::process::Command;

use serde::Serialize;

/// Whether a bigger figure is better (a rate) or worse (a time, a size).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Better {
    Higher,
    Lower,
}

/// One line of the table.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Row {
    pub(crate) workload: String,
    pub(crate) unit: String,
    pub(crate) better: Better,
    /// The median of the outbox's rounds.
    pub(crate) outbox: f64,
    /// The median of the raw engine loop's rounds, when there is a raw side.
    pub(crate) raw: Option<f64>,
    /// Outbox over raw as throughput (>1: the outbox is faster).
    pub(crate) ratio: Option<f64>,
    pub(crate) outbox_rounds: Vec<f64>,
    pub(crate) raw_rounds: Vec<f64>,
    pub(crate) note: Option<String>,
}

impl Row {
    /// A row with a raw side; `ratio` is throughput outbox/raw.
    pub(crate) fn pair(
        workload: impl Into<String>,
        unit: &str,
        better: Better,
        outbox_rounds: Vec<f64>,
        raw_rounds: Vec<f64>,
    ) -> Self {
        let outbox = median(&outbox_rounds);
        let raw = median(&raw_rounds);
        Row {
            workload: workload.into(),
            unit: unit.into(),
            better,
            outbox,
            raw: Some(raw),
            ratio: Some(throughput_ratio(better, outbox, raw)),
            outbox_rounds,
            raw_rounds,
            note: None,
        }
    }

    /// A row of the outbox alone.
    pub(crate) fn single(workload: impl Into<String>, unit: &str, better: Better, rounds: Vec<f64>) -> Self {
        Row {
            workload: workload.into(),
            unit: unit.into(),
            better,
            outbox: median(&rounds),
            raw: None,
            ratio: None,
            outbox_rounds: rounds,
            raw_rounds: Vec::new(),
            note: None,
        }
    }

    pub(crate) fn with_ratio(mut self, ratio: f64) -> Self {
        self.ratio = Some(ratio);
        self
    }

    pub(crate) fn with_note(mut self, note: impl Into<String>) -> Self {
        self.note = Some(note.into());
        self
    }
}

/// Outbox over raw as throughput: rates divide directly, times inversely.
pub(crate) fn throughput_ratio(better: Better, outbox: f64, raw: f64) -> f64 {
    match better {
        Better::Higher => outbox / raw,
        Better::Lower => raw / outbox,
    }
}

/// The median (the mean of the middle two for an even count).
pub(crate) fn median(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The nearest-rank percentile `p` (0..=100) of sorted values.
pub(crate) fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The whole run.
#[derive(Debug, Serialize)]
pub(crate) struct Report {
    pub(crate) commit: Option<String>,
    pub(crate) sqlite_version: String,
    pub(crate) date: String,
    pub(crate) cores: usize,
    pub(crate) quick: bool,
    pub(crate) seconds: f64,
    pub(crate) rows: Vec<Row>,
}

impl Report {
    pub(crate) fn new(quick: bool, rows: Vec<Row>, seconds: f64) -> Self {
        let commit = Command::new("git")
            .args(["rev-parse", "HEAD"])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .map(|s| s.trim().to_string());
        Report {
            commit,
            sqlite_version: rusqlite::version().to_string(),
            date: utc_now(),
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            quick,
            seconds,
            rows,
        }
    }

    pub(crate) fn markdown(&self) -> String {
        let mut s = format!(
            "outbox-bench ({}), commit {}, SQLite {}, {} cores, {}; medians of 3 interleaved rounds per side\n\n",
            if self.quick { "quick" } else { "full" },
            self.commit
                .as_deref()
                .map_or("unknown", |c| &c[..c.len().min(12)]),
            self.sqlite_version,
            self.cores,
            self.date
        );
        s.push_str(LEGEND);
        s.push_str("| workload | outbox | raw engine loop | ratio (outbox/raw, throughput) |\n");
        s.push_str("|---|---:|---:|---:|\n");
        for r in &self.rows {
            let raw = r.raw.map_or("—".to_string(), |v| fmt_value(v, &r.unit));
            let ratio = r.ratio.map_or("—".to_string(), |v| format!("{v:.2}"));
            let name = match &r.note {
                Some(n) => format!("{} ({n})", r.workload),
                None => r.workload.clone(),
            };
            s.push_str(&format!(
                "| {name} | {} | {raw} | {ratio} |\n",
                fmt_value(r.outbox, &r.unit)
            ));
        }
        s
    }
}

/// What each column is, printed above the table.
const LEGEND: &str = "outbox: the outbox through its public API, default settings unless the row says. \
raw engine loop: the minimal loop a careful engineer writes by hand for the same guarantee at the same \
durability (SQLite: rusqlite, event + outbox row per transaction at synchronous=FULL, one-statement \
claims and deletes at NORMAL, checkpoint compare-and-set in the projection transaction at FULL; \
Postgres: sqlx, each batch one statement). Lag rows: from the append's scheduled time to the event \
being visible to a reader of the projection after its commit; the in-process SQLite rows against the \
raw engine loop with its worker thread beside the appender, woken by each append, draining in sweeps \
(ratio: raw lag over the outbox's, above 1 when the outbox's is lower).\n\n";

fn fmt_value(v: f64, unit: &str) -> String {
    if v >= 100.0 {
        format!("{v:.0} {unit}")
    } else if v >= 10.0 {
        format!("{v:.1} {unit}")
    } else {
        format!("{v:.2} {unit}")
    }
}

/// Now as `YYYY-MM-DDTHH:MM:SSZ`.
fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs()) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_percentile() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        let sorted: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&sorted, 50.0), 50.0);
        assert_eq!(percentile(&sorted, 99.0), 99.0);
        assert_eq!(percentile(&sorted, 100.0), 100.0);
        assert_eq!(percentile(&[7.0], 99.0), 7.0);
    }
}
