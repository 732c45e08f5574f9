//! The overview's throughput chart: the journal's per-minute activity
//! (applied, failed and dead-lettered, summed over every worker) drawn on
//! the server as inline SVG, one stacked bar a minute, with a `<title>` per
//! bar for the exact counts. No script, no style attribute (presentation
//! attributes only, so the page's content security policy holds).

use std::fmt::Write;

use outbox_core::{ActivityCounts, MINUTE_MS, MinuteActivity};

use super::html::{esc, table};

/// The chart's size in SVG user units.
const WIDTH: u64 = 720;
const HEIGHT: u64 = 140;
/// Room under the bars for the axis labels.
const AXIS: u64 = 16;

/// The series, bottom to top: (name, colour).
const SERIES: [(&str, &str); 3] = [("applied", "#2e7d32"), ("failed", "#ef6c00"), ("dead", "#b71c1c")];

fn values(c: &ActivityCounts) -> [u64; 3] {
    [c.applied, c.failed, c.dead]
}

/// `HH:MM` (UTC) of a minute's start.
fn clock(minute: &MinuteActivity) -> String {
    let m = minute
        .minute
        .as_millis()
        .div_euclid(MINUTE_MS)
        .rem_euclid(24 * 60);
    format!("{:02}:{:02}", m / 60, m % 60)
}

/// The totals table and the chart of `minutes` (oldest first, one entry per
/// minute, as [`ActivitySeries::filled`](outbox_core::ActivitySeries::filled)
/// gives them).
pub(crate) fn throughput(minutes: &[MinuteActivity]) -> String {
    let mut totals = [0u64; 3];
    for m in minutes {
        for (t, v) in totals.iter_mut().zip(values(&m.counts)) {
            *t += v;
        }
    }
    let mut out = table(
        "activity",
        &["applied", "failed", "dead-lettered"],
        &[SERIES
            .iter()
            .zip(totals)
            .map(|((name, _), t)| format!("<span id=\"activity-{name}\" class=\"num\">{t}</span>"))
            .collect()],
    );
    out.push_str(&svg(minutes));
    out
}

fn svg(minutes: &[MinuteActivity]) -> String {
    let peak = minutes
        .iter()
        .map(|m| values(&m.counts).iter().sum::<u64>())
        .max()
        .unwrap_or(0)
        .max(1);
    let n = minutes.len().max(1) as u64;
    let slot = WIDTH / n;
    let plot = HEIGHT - AXIS;
    let mut out = String::new();
    let _ = write!(
        out,
        "<svg id=\"throughput\" role=\"img\" width=\"{WIDTH}\" height=\"{HEIGHT}\" \
         viewBox=\"0 0 {WIDTH} {HEIGHT}\" xmlns=\"http://www.w3.org/2000/svg\">\
         <title>Events per minute over the last {n} minutes (peak {peak})</title>\
         <rect x=\"0\" y=\"0\" width=\"{WIDTH}\" height=\"{plot}\" fill=\"#fff\" stroke=\"#ccc\"/>"
    );
    for (i, m) in minutes.iter().enumerate() {
        let x = i as u64 * slot;
        let mut y = plot;
        let vs = values(&m.counts);
        let _ = write!(
            out,
            "<g><title>{} applied {}, failed {}, dead {}</title>",
            esc(&clock(m)),
            vs[0],
            vs[1],
            vs[2]
        );
        for ((_, colour), v) in SERIES.iter().zip(vs) {
            // Any non-zero count gets at least a pixel, so one failure shows.
            let h = if v == 0 { 0 } else { (v * plot / peak).max(1) };
            if h == 0 {
                continue;
            }
            y = y.saturating_sub(h);
            let _ = write!(
                out,
                "<rect x=\"{x}\" y=\"{y}\" width=\"{}\" height=\"{h}\" fill=\"{colour}\"/>",
                slot.saturating_sub(1).max(1)
            );
        }
        // An invisible full-height target, so the tooltip shows on empty minutes too.
        let _ = write!(
            out,
            "<rect x=\"{x}\" y=\"0\" width=\"{slot}\" height=\"{plot}\" fill=\"transparent\"/></g>"
        );
    }
    if let (Some(first), Some(last)) = (minutes.first(), minutes.last()) {
        let _ = write!(
            out,
            "<text x=\"2\" y=\"{}\" font-size=\"11\" fill=\"#555\">{}</text>\
             <text x=\"{}\" y=\"{}\" font-size=\"11\" fill=\"#555\" text-anchor=\"end\">{} (UTC)</text>\
             <text x=\"4\" y=\"12\" font-size=\"11\" fill=\"#555\">peak {peak}/min</text>",
            HEIGHT - 3,
            esc(&clock(first)),
            WIDTH - 2,
            HEIGHT - 3,
            esc(&clock(last)),
        );
    }
    out.push_str("</svg>");
    out
}

#[cfg(test)]
mod tests {
    use outbox_core::Timestamp;

    use super::*;

    fn minute(i: i64, applied: u64, failed: u64, dead: u64) -> MinuteActivity {
        MinuteActivity {
            minute: Timestamp::from_millis(i * MINUTE_MS),
            counts: ActivityCounts {
                applied,
                failed,
                dead,
            },
        }
    }

    #[test]
    fn totals_sum_every_minute() {
        let html = throughput(&[minute(0, 5, 1, 0), minute(1, 0, 0, 0), minute(2, 7, 0, 2)]);
        assert!(
            html.contains("id=\"activity-applied\" class=\"num\">12<"),
            "{html}"
        );
        assert!(html.contains("id=\"activity-failed\" class=\"num\">1<"), "{html}");
        assert!(html.contains("id=\"activity-dead\" class=\"num\">2<"), "{html}");
    }

    #[test]
    fn bars_scale_to_the_peak_and_a_single_failure_shows() {
        let html = svg(&[minute(0, 1000, 0, 0), minute(1, 999, 1, 0)]);
        let plot = HEIGHT - AXIS;
        assert!(
            html.contains(&format!(
                "y=\"0\" width=\"359\" height=\"{plot}\" fill=\"#2e7d32\""
            )),
            "the peak minute fills the plot: {html}"
        );
        assert!(
            html.contains("height=\"1\" fill=\"#ef6c00\""),
            "one failure among 1000 still gets a pixel: {html}"
        );
        assert!(html.contains("<title>00:01 applied 999, failed 1, dead 0</title>"));
        assert_eq!(html.matches("<g>").count(), 2, "one group per minute");
    }

    #[test]
    fn an_idle_hour_draws_empty_slots() {
        let idle: Vec<_> = (0..60).map(|i| minute(i, 0, 0, 0)).collect();
        let html = svg(&idle);
        assert!(!html.contains("fill=\"#2e7d32\""), "no bar without activity");
        assert!(html.contains(">00:00<") && html.contains(">00:59 (UTC)<"));
    }
}
