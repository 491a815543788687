//! Output for people: aligned tables, relative times, short text; and the `--older-than` parser.

use std::time::Duration;

use chrono::{DateTime, Utc};

/// Columns aligned on the widest cell, two spaces apart; the last column is not padded. Widths
/// are what a terminal gives the text (a CJK character or an emoji takes two columns), and a cell
/// is one line: its tabs and line breaks become spaces, and other control characters are
/// escaped ([`for_terminal`]).
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    use unicode_width::UnicodeWidthStr;
    // Escaped here, before the widths are measured (as `out` would escape them after).
    let flat = |cell: &str| for_terminal(&cell.replace(['\t', '\n', '\r'], " ")).into_owned();
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|row| row.iter().map(|c| flat(c)).collect())
        .collect();
    let mut widths: Vec<usize> = headers.iter().map(|h| h.width()).collect();
    for row in &rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.width());
            }
        }
    }
    let line = |cells: Vec<&str>| {
        let last = cells.len().saturating_sub(1);
        let mut s = String::new();
        for (i, cell) in cells.into_iter().enumerate() {
            s.push_str(cell);
            if i < last {
                let pad = widths[i].saturating_sub(cell.width()) + 2;
                s.extend(std::iter::repeat_n(' ', pad));
            }
        }
        s.truncate(s.trim_end().len());
        s.push('\n');
        s
    };
    let mut out = line(headers.to_vec());
    for row in &rows {
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

/// Whether `c` must not reach a terminal as it is: a control character (C0 but line feed and tab,
/// DEL, C1: escape sequences can move the cursor, rewrite lines, retitle the window) or a
/// bidirectional formatting character (it reorders what is shown, so text reads unlike its bytes).
fn unsafe_for_terminal(c: char) -> bool {
    (c.is_control() && c != '\n' && c != '\t')
        || matches!(c, '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `s` as it may be shown to people on a terminal: what [`unsafe_for_terminal`] names is written
/// as `\uXXXX` instead. Questions, options, results and errors come from agents, LLMs, tools and
/// the network: an escape sequence in a prompt could otherwise rewrite the `command:` line or
/// hide `!! dangerous` on the very screen where a person approves a call. JSON stays valid (a
/// `\uXXXX` escape is the same character to a JSON reader, and JSON writers already escape
/// C0 controls).
pub fn for_terminal(s: &str) -> std::borrow::Cow<'_, str> {
    if !s.chars().any(unsafe_for_terminal) {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut shown = String::with_capacity(s.len() + 16);
    for c in s.chars() {
        if unsafe_for_terminal(c) {
            shown.push_str(&format!("\\u{:04x}", u32::from(c)));
        } else {
            shown.push(c);
        }
    }
    std::borrow::Cow::Owned(shown)
}

/// `s` as one word of a POSIX shell command, for commands the CLI prints to copy: as it is when
/// it holds only characters no shell treats specially, else in single quotes. An option id or an
/// example answer comes from the agent (an LLM picks option ids): a hint must not run what a
/// crafted one would make of it when pasted.
pub fn shell_word(s: &str) -> String {
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "_./:@%+=,-".contains(c));
    if plain {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// An id given on the command line that goes into a URL's path (a webhook's, a delegation's):
/// letters, digits, `-` and `_` only, so that it names one resource (`../runs/…/cancel` would
/// make the request another one).
pub fn path_id(s: &str) -> Result<String, String> {
    let ok = !s.is_empty()
        && s.len() <= 128
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if ok {
        Ok(s.to_owned())
    } else {
        Err("not an id: ids are letters, digits, `-` and `_` (the ID column of the listing)".into())
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
    fn escape_sequences_and_bidi_controls_never_reach_the_terminal() {
        // A prompt that would move the cursor up and erase the line above it.
        assert_eq!(
            for_terminal("Go?\x1b[1A\x1b[2K\rcommand: ls"),
            "Go?\\u001b[1A\\u001b[2K\\u000dcommand: ls"
        );
        // C1 (CSI), DEL, and a right-to-left override.
        assert_eq!(
            for_terminal("a\u{9b}31mb\u{7f}c\u{202e}d"),
            "a\\u009b31mb\\u007fc\\u202ed"
        );
        // Lines, tabs and every other character stay as they are, unchanged and not copied.
        let plain = "deploy to prod?\n\tnotes: ünïcode, 日本, emoji 🚀";
        assert!(matches!(
            for_terminal(plain),
            std::borrow::Cow::Borrowed(s) if s == plain
        ));
        // In a JSON document the escape reads back as the same character.
        let doc = serde_json::json!({"prompt": "x\u{202e}y"}).to_string();
        let back: serde_json::Value =
            serde_json::from_str(&for_terminal(&doc)).expect("still JSON");
        assert_eq!(back["prompt"], "x\u{202e}y");
    }

    #[test]
    fn shell_words_are_quoted_unless_plain() {
        assert_eq!(shell_word("approve"), "approve");
        assert_eq!(shell_word("a b"), "'a b'");
        assert_eq!(shell_word(""), "''");
        assert_eq!(shell_word(r#"{"a": 1}"#), r#"'{"a": 1}'"#);
        // What sh makes of a quoted word is the word itself.
        for word in [
            "x'; touch pwned; echo '",
            "$(id)",
            "`id`",
            r"a\b",
            "it's",
            "a b",
        ] {
            let out = std::process::Command::new("sh")
                .arg("-c")
                .arg(format!("printf %s {}", shell_word(word)))
                .output()
                .expect("sh");
            assert_eq!(String::from_utf8_lossy(&out.stdout), word);
        }
    }

    #[test]
    fn ids_for_paths_are_one_segment() {
        assert!(path_id("01a2245a-1383-7657-ab5c-e517fa8f4adc").is_ok());
        for bad in ["", "../runs/x/cancel", "a/b", "%2e%2e", "a?b", "a#b", ".."] {
            assert!(path_id(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn wide_characters_and_tabs_keep_the_columns_aligned() {
        let t = table(
            &["AGENT", "STATUS"],
            &[
                vec!["日本語".into(), "OK".into()],
                vec!["a\tb".into(), "OK".into()],
                vec!["plain".into(), "OK".into()],
            ],
        );
        let lines: Vec<&str> = t.lines().collect();
        // Every STATUS starts in the same terminal column: 6 (the widest AGENT) + 2.
        for line in &lines[1..] {
            let (agent, _) = line.split_once("OK").expect("a status");
            assert_eq!(unicode_width::UnicodeWidthStr::width(agent), 8, "{t}");
        }
        assert!(!t.contains('\t'), "{t}");
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
