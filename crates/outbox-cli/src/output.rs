//! Printing: human text or JSON.

use std::fmt;
use std::io::Write;

use serde::Serialize;

/// Standard output could not be written: its reader is gone (a closed
/// pipe) or its file is full. Commands return it like any other error;
/// the binary exits quietly on a closed pipe and with one line otherwise.
#[derive(Debug)]
pub(crate) struct StdoutFailed(pub(crate) std::io::Error);

impl fmt::Display for StdoutFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cannot write to standard output: {}", self.0)
    }
}

impl std::error::Error for StdoutFailed {}

impl StdoutFailed {
    /// Whether the reader went away (`| head`, a pager quit): the output
    /// is no longer wanted, which is no failure of the command.
    pub(crate) fn reader_gone(&self) -> bool {
        self.0.kind() == std::io::ErrorKind::BrokenPipe
    }
}

/// Writes one line to stdout (the [`outln!`] macro's body), with every
/// character that could take over the terminal or hide in plain sight
/// escaped ([`visible`]): stream ids and error texts come from applications.
pub(crate) fn line(args: fmt::Arguments<'_>) -> anyhow::Result<()> {
    let text = fmt::format(args);
    let mut out = std::io::stdout().lock();
    out.write_all(visible(&text).as_bytes())
        .and_then(|()| out.write_all(b"\n"))
        .and_then(|()| out.flush())
        .map_err(|e| StdoutFailed(e).into())
}

/// Prints `value` as pretty JSON on stdout.
pub(crate) fn json<T: Serialize>(value: &T) -> anyhow::Result<()> {
    outln!("{}", serde_json::to_string_pretty(value)?)
}

/// Prints `value` as one JSON line on stdout.
pub(crate) fn json_line<T: Serialize>(value: &T) -> anyhow::Result<()> {
    outln!("{}", serde_json::to_string(value)?)
}

/// `line` with every hint of a command, `` `outbox migrate` ``, naming the
/// running binary instead (`` `bankctl migrate` ``). The libraries below the
/// CLI (core, runtime, the adapters) cannot know the name of the binary an
/// application built with [`crate::run`], so their errors name the stock
/// command in backticks; what prints them (the error line, the monitor's
/// error answers) renames it here, in one place.
pub(crate) fn named_for(line: &str, bin: &str) -> String {
    if bin == "outbox" {
        return line.to_owned();
    }
    line.replace("`outbox ", &format!("`{bin} "))
}

/// Milliseconds as a short human duration.
pub(crate) fn human_ms(ms: u64) -> String {
    match ms {
        0..=999 => format!("{ms}ms"),
        1_000..=59_999 => format!("{:.1}s", ms as f64 / 1000.0),
        60_000..=3_599_999 => format!("{}m{:02}s", ms / 60_000, (ms / 1000) % 60),
        _ => format!("{}h{:02}m", ms / 3_600_000, (ms / 60_000) % 60),
    }
}

/// Whether `c` must not reach a terminal or a page as it is: a control
/// character (C0 but newline and tab, DEL, C1: escape sequences retitle or
/// clear a terminal), a bidirectional control (reorders what follows it),
/// a zero-width or invisible character (`campaign-00\u{200B}1` would look
/// like `campaign-001`) or a line separator.
pub(crate) fn deceptive(c: char) -> bool {
    matches!(c,
        '\u{0}'..='\u{8}' | '\u{b}'..='\u{1f}' | '\u{7f}'..='\u{9f}'
        | '\u{ad}' | '\u{34f}' | '\u{61c}' | '\u{115f}' | '\u{1160}' | '\u{17b4}' | '\u{17b5}'
        | '\u{180b}'..='\u{180f}' | '\u{200b}'..='\u{200f}' | '\u{2028}'..='\u{202e}'
        | '\u{2060}'..='\u{206f}' | '\u{3164}' | '\u{fe00}'..='\u{fe0f}' | '\u{feff}'
        | '\u{ffa0}' | '\u{fff0}'..='\u{fffb}' | '\u{e0000}'..='\u{e0fff}')
}

/// `text` with every [`deceptive`] character written as its code, `\uXXXX`
/// (the form JSON and JavaScript read back; `\u{XXXXX}` above U+FFFF).
pub(crate) fn visible(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(deceptive) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if !deceptive(c) {
            out.push(c);
        } else if u32::from(c) <= 0xffff {
            let _ = fmt::Write::write_fmt(&mut out, format_args!("\\u{:04X}", u32::from(c)));
        } else {
            let _ = fmt::Write::write_fmt(&mut out, format_args!("\\u{{{:X}}}", u32::from(c)));
        }
    }
    std::borrow::Cow::Owned(out)
}

/// `text` with the password of every URL-like `user:password@host` in it
/// written `***`: a URL echoed by an error (a driver's, a mistyped flag's)
/// never shows its credentials. A word is redacted when an `@` in it
/// follows a `:` with no `/` between them, counting from its last `//` (or
/// its start).
pub(crate) fn redact_credentials(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.contains('@') {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    let mut word = String::new();
    let flush = |word: &mut String, out: &mut String| {
        out.push_str(&redact_word(word));
        word.clear();
    };
    for c in text.chars() {
        if c.is_whitespace() || matches!(c, '"' | '\'' | '`' | '(' | ')' | '<' | '>' | ',') {
            flush(&mut word, &mut out);
            out.push(c);
        } else {
            word.push(c);
        }
    }
    flush(&mut word, &mut out);
    std::borrow::Cow::Owned(out)
}

/// `text` fit for a terminal line: credentials redacted
/// ([`redact_credentials`]) and deceptive characters escaped ([`visible`]).
pub(crate) fn safe(text: &str) -> String {
    visible(&redact_credentials(text)).into_owned()
}

fn redact_word(word: &str) -> String {
    let Some(at) = word.rfind('@') else {
        return word.to_owned();
    };
    let start = word[..at].rfind("//").map_or(0, |i| i + 2);
    let userinfo = &word[start..at];
    match userinfo.find(':') {
        Some(colon) if !userinfo.contains('/') && colon + 1 < userinfo.len() => {
            format!("{}***{}", &word[..start + colon + 1], &word[at..])
        }
        _ => word.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::{redact_credentials, visible};

    #[test]
    fn passwords_in_urls_are_redacted() {
        for (given, shown) in [
            (
                "postgres://app:S3cretPW@db.internal:5432/shop",
                "postgres://app:***@db.internal:5432/shop",
            ),
            ("postgres//app:S3cretPW@host/db", "postgres//app:***@host/db"),
            (
                "cannot open \"postgresql://u:p%40ss@h/db\": refused",
                "cannot open \"postgresql://u:***@h/db\": refused",
            ),
            (
                "app:S3cretPW@host/db is not a file",
                "app:***@host/db is not a file",
            ),
            (
                "no credentials: postgres://app@host/db",
                "no credentials: postgres://app@host/db",
            ),
            ("an address user@example.com", "an address user@example.com"),
            ("nothing here", "nothing here"),
        ] {
            assert_eq!(redact_credentials(given), shown, "{given}");
        }
    }

    #[test]
    fn terminal_controls_and_look_alikes_are_written_as_their_codes() {
        assert_eq!(
            visible("plain text, tab\tand\nnewline"),
            "plain text, tab\tand\nnewline"
        );
        assert_eq!(
            visible("\u{1b}]0;owned\u{7}\u{1b}[2J"),
            "\\u001B]0;owned\\u0007\\u001B[2J"
        );
        assert_eq!(visible("campaign-00\u{200b}1"), "campaign-00\\u200B1");
        assert_eq!(visible("abc\u{202e}fed"), "abc\\u202Efed");
        assert_eq!(visible("\u{9b}31m"), "\\u009B31m");
        assert_eq!(visible("tag\u{e0041}"), "tag\\u{E0041}");
        assert_eq!(visible("ünïcödé ok, 日本"), "ünïcödé ok, 日本");
        // A JSON string with an escaped character still parses to the same text.
        let json = visible("\"a\u{200b}b\"").into_owned();
        assert_eq!(serde_json::from_str::<String>(&json).unwrap(), "a\u{200b}b");
    }
}
