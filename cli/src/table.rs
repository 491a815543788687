//! Output for people: aligned tables, relative times, short text; and the `--older-than` parser.

use std::time::Duration;

use chrono::{DateTime, Utc};

/// Columns aligned on the widest cell, two spaces apart; the last column is not padded.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.chars().count());
            }
        }
    }
    let line = |cells: Vec<&str>| {
        let last = cells.len().saturating_sub(1);
        let mut s = String::new();
        for (i, cell) in cells.into_iter().enumerate() {
            s.push_str(cell);
            if i < last {
                let pad = widths[i].saturating_sub(cell.chars().count()) + 2;
                s.extend(std::iter::repeat_n(' ', pad));
            }
        }
        s.truncate(s.trim_end().len());
        s.push('\n');
        s
    };
    let mut out = line(headers.to_vec());
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}

/// A span of whole seconds for people: `45s`, `12m`, `3h`, `2d`.
pub fn span(secs: i64) -> String {
    let s = secs.max(0);
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        3600..86_400 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86_400),
    }
}

/// How long ago `t` was: `3s ago`, `5m ago`.
pub fn ago(t: DateTime<Utc>, now: DateTime<Utc>) -> String {
    format!("{} ago", span((now - t).num_seconds()))
}

/// How long until `t`: `14m`, or `expired` once it has passed.
pub fn until(t: DateTime<Utc>, now: DateTime<Utc>) -> String {
    let left = (t - now).num_seconds();
    if t <= now {
        "expired".into()
    } else {
        span(left)
    }
}

/// One line of at most `n` characters (newlines folded, `…` when cut).
pub fn short(s: &str, n: usize) -> String {
    let one_line = s.trim().replace(['\n', '\r'], " ");
    if one_line.chars().count() > n {
        let cut: String = one_line.chars().take(n.saturating_sub(1)).collect();
        format!("{cut}…")
    } else {
        one_line
    }
}

/// `--older-than`: a whole number with a unit, `90s`, `5m`, `2h`, `1d` (a bare number is seconds).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a duration: write e.g. 90s, 5m, 2h or 1d"))?;
    let factor = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        other => {
            return Err(format!(
                "`{other}` is not a unit of time: use s, m, h or d (e.g. 5m)"
            ));
        }
    };
    n.checked_mul(factor)
        .map(Duration::from_secs)
        .ok_or_else(|| format!("`{s}` is too long a duration"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_on_the_widest_cell_and_do_not_pad_the_last_column() {
        let t = table(
            &["RUN", "STATUS", "TASK"],
            &[
                vec!["a".into(), "COMPLETED".into(), "greet".into()],
                vec!["bbbb".into(), "QUEUED".into(), "".into()],
            ],
        );
        assert_eq!(
            t,
            "RUN   STATUS     TASK\na     COMPLETED  greet\nbbbb  QUEUED\n"
        );
    }

    #[test]
    fn spans_and_relative_times_read_like_people_say_them() {
        let now = Utc::now();
        assert_eq!(span(3), "3s");
        assert_eq!(span(59), "59s");
        assert_eq!(span(61), "1m");
        assert_eq!(span(7200), "2h");
        assert_eq!(span(3 * 86_400 + 5), "3d");
        assert_eq!(span(-4), "0s");
        assert_eq!(ago(now - chrono::Duration::seconds(3), now), "3s ago");
        assert_eq!(until(now + chrono::Duration::seconds(900), now), "15m");
        assert_eq!(until(now - chrono::Duration::seconds(1), now), "expired");
    }

    #[test]
    fn short_keeps_one_line_and_marks_the_cut() {
        assert_eq!(short("a\nb", 10), "a b");
        assert_eq!(short("abcdefghij", 5), "abcd…");
        assert_eq!(short("abcde", 5), "abcde");
    }

    #[test]
    fn durations_take_a_unit_and_refuse_anything_else() {
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_duration("1d"), Ok(Duration::from_secs(86_400)));
        for bad in ["", "m", "5x", "-5m", "5 m", "1.5h"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }
}
