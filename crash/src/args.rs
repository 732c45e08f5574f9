//! The command line of every subcommand: `--key value` arguments and the
//! numbers in them.

use anyhow::{Context, Result};

/// `--key value` arguments.
pub(crate) struct Args(pub(crate) Vec<String>);

impl Args {
    pub(crate) fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .position(|a| a == key)
            .and_then(|i| self.0.get(i + 1))
            .map(String::as_str)
    }

    /// Whether the flag `key` (one without a value) is given.
    pub(crate) fn has(&self, key: &str) -> bool {
        self.0.iter().any(|a| a == key)
    }

    pub(crate) fn req(&self, key: &str) -> Result<&str> {
        self.get(key).with_context(|| format!("missing {key}"))
    }

    pub(crate) fn num(&self, key: &str, default: u64) -> Result<u64> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => parse_u64(v).with_context(|| format!("{key} {v:?}")),
        }
    }
}

/// `--seed S`, or one from the clock (printed by the caller either way).
pub(crate) fn seed_arg(args: &Args) -> Result<u64> {
    Ok(match args.get("--seed") {
        Some(s) => parse_u64(s)?,
        None => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(42),
    })
}

/// A decimal or `0x` hexadecimal number.
pub(crate) fn parse_u64(v: &str) -> Result<u64> {
    Ok(match v.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16)?,
        None => v.parse()?,
    })
}
