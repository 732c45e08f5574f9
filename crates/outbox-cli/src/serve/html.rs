//! Server-side HTML: escaping and the page frame. No script, no external
//! resource; the stylesheet is served by the binary (`/style.css`).

use std::fmt::Write;

/// `s` escaped for HTML text, with every control, bidirectional or
/// invisible character written as its code (`\u200B`): what an operator
/// reads is what is stored.
pub(crate) fn esc(s: &str) -> String {
    attr(&crate::output::visible(s))
}

/// `s` escaped for an attribute value whose exact text matters (a form
/// field the browser sends back): markup escaped, nothing else changed.
pub(crate) fn attr(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The stylesheet.
pub(crate) const STYLE: &str = "\
body{font-family:system-ui,sans-serif;margin:1.5rem;color:#222;background:#fafafa}\
nav a{margin-right:1rem}h1{font-size:1.4rem}h2{font-size:1.1rem;margin-top:1.5rem}\
table{border-collapse:collapse;margin:.5rem 0;background:#fff}\
th,td{border:1px solid #ccc;padding:.25rem .5rem;text-align:left;font-size:.9rem;vertical-align:top;\
overflow-wrap:anywhere;max-width:32rem}\
th{background:#eee}.num{text-align:right;font-variant-numeric:tabular-nums}\
.dead{color:#a00;font-weight:bold}.failed{color:#b60}.ok{color:#070}\
.note{color:#555;font-size:.85rem}form.inline{display:inline}\
input[type=password]{width:9rem}.msg{padding:.5rem;border:1px solid #ccc;background:#fff}\
.banner{padding:.6rem .8rem;border-radius:4px;font-weight:600}\
.banner.ok{background:#e6f4e6;color:#060}.banner.warn{background:#fff4e0;color:#850}\
.banner.bad{background:#fde8e8;color:#a00}\
pre{white-space:pre-wrap;overflow-wrap:anywhere;background:#fff;border:1px solid #ccc;padding:.5rem;max-width:60rem}";

/// A whole page: the navigation, `title` and `body` (already escaped).
pub(crate) fn page(app: &str, title: &str, body: &str) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width\">\
         <title>{title} - {app} outbox</title><link rel=\"stylesheet\" href=\"/style.css\"></head>\
         <body><nav><a href=\"/\">Overview</a><a href=\"/blocked\">Blocked streams</a>\
         <a href=\"/dead\">Dead by error</a><a href=\"/partitions\">Partitions</a>\
         <a href=\"/sinks\">Sinks</a><a href=\"/runs\">Runs</a><a href=\"/audit\">Audit</a><a href=\"/metrics\">Metrics</a>\
         <form class=\"inline\" method=\"get\" action=\"/stream\"><input name=\"stream\" \
         placeholder=\"stream id\" aria-label=\"stream id\" required><button type=\"submit\">Find</button></form></nav><h1>{title}</h1>{body}</body></html>",
        title = esc(title),
        app = esc(app),
    );
    out
}

/// A table with a header row; `rows` cells are already escaped HTML.
pub(crate) fn table(id: &str, head: &[&str], rows: &[Vec<String>]) -> String {
    let mut out = format!("<table id=\"{}\"><thead><tr>", esc(id));
    for h in head {
        let _ = write!(out, "<th>{}</th>", esc(h));
    }
    out.push_str("</tr></thead><tbody>");
    for r in rows {
        out.push_str("<tr>");
        for c in r {
            let _ = write!(out, "<td>{c}</td>");
        }
        out.push_str("</tr>");
    }
    out.push_str("</tbody></table>");
    out
}

/// A POST form to an action with hidden `fields`, a token box and a button.
pub(crate) fn action_form(action: &str, fields: &[(&str, String)], button: &str) -> String {
    let mut out = format!(
        "<form class=\"inline\" method=\"post\" action=\"{}\">",
        esc(action)
    );
    for (k, v) in fields {
        let _ = write!(
            out,
            "<input type=\"hidden\" name=\"{}\" value=\"{}\">",
            attr(k),
            attr(v)
        );
    }
    let _ = write!(
        out,
        "<input type=\"password\" name=\"token\" placeholder=\"token\" autocomplete=\"off\" required>\
         <button type=\"submit\">{}</button></form>",
        esc(button)
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_every_special_character() {
        assert_eq!(
            esc("<a href=\"x\">'&'</a>"),
            "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;"
        );
    }

    #[test]
    fn page_escapes_the_title() {
        assert!(page("a<b", "t<i>", "").contains("t&lt;i&gt; - a&lt;b"));
    }
}
