//! Settings of the fleet's binaries: `--name value` / `--name=value` flags win over `DELTA_*`
//! environment variables (docs/protocol.md §9), which win over defaults. Every bad value is collected
//! so that a binary reports them all at once (and exits 64) instead of the first one only.

use std::collections::HashMap;
use std::sync::Arc;

use delta_protocol::secret::SecretsKey;
use delta_store::redis::{Durability, MAX_BUCKETS};

/// Why the value of setting `env_name` may not be given as a flag, if it may not: a secret (a
/// token, the secrets key, a password) or a URL that carries credentials.
fn secret_in_flag(env_name: &str, value: &str) -> Option<&'static str> {
    let secret = env_name.ends_with("_TOKEN")
        || env_name.ends_with("_SECRETS_KEY")
        || env_name.contains("PASSWORD");
    if secret {
        return Some("a secret");
    }
    // Any URL of a list (a cluster's servers, seeds) with a user, a password or a token before
    // its host: what errors and logs hide, `ps` would show.
    let credentials = delta_protocol::without_credentials(value) != value;
    credentials.then_some("a URL with credentials in it")
}

/// One setting: its environment name, its flag (without `--`) and its default.
pub type Setting = (&'static str, &'static str, &'static str);

/// Flags and environment read against a table of settings, with the errors found so far.
pub struct Settings<'a> {
    table: &'a [Setting],
    flags: HashMap<&'static str, String>,
    env: &'a HashMap<String, String>,
    /// Every problem found, in the words a user needs to fix it.
    pub errors: Vec<String>,
}

impl<'a> Settings<'a> {
    /// Reads `args` (flags only) against `table`; unknown flags and missing values are errors.
    pub fn parse(table: &'a [Setting], args: &[String], env: &'a HashMap<String, String>) -> Self {
        let mut errors = vec![];
        let mut flags = HashMap::new();
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let Some(body) = a.strip_prefix("--") else {
                errors.push(format!("unexpected argument `{a}`"));
                continue;
            };
            let (name, value) = match body.split_once('=') {
                Some((n, v)) => (n, Some(v.to_owned())),
                None => (body, None),
            };
            let Some((env_name, flag, _)) = table.iter().find(|(_, f, _)| *f == name) else {
                errors.push(format!("unknown flag `--{name}` (see --help)"));
                // Its value, if any, is part of the same mistake.
                if value.is_none() && it.as_slice().first().is_some_and(|n| !n.starts_with("--")) {
                    it.next();
                }
                continue;
            };
            match value.or_else(|| it.next().cloned()) {
                Some(v) => {
                    if let Some(why) = secret_in_flag(env_name, &v) {
                        errors.push(format!(
                            "`--{name}`: {why}; every user of this machine sees a program's flags (`ps`): set {env_name} in the environment instead"
                        ));
                        continue;
                    }
                    flags.insert(*flag, v);
                }
                None => errors.push(format!("`--{name}` needs a value")),
            }
        }
        Self {
            table,
            flags,
            env,
            errors,
        }
    }

    /// The value of a setting and where it came from (`--flag` or the variable's name).
    pub fn get(&self, env_name: &str) -> (String, String) {
        let (_, flag, default) = self
            .table
            .iter()
            .find(|(e, _, _)| *e == env_name)
            .copied()
            .unwrap_or(("", "", ""));
        match (self.flags.get(flag), self.env.get(env_name)) {
            (Some(v), _) => (v.clone(), format!("--{flag}")),
            (None, Some(v)) => (v.clone(), env_name.to_owned()),
            (None, None) => (default.to_owned(), format!("--{flag}")),
        }
    }

    /// A whole number ≥ `min`.
    pub fn number(&mut self, env_name: &str, min: u64) -> u64 {
        let (v, from) = self.get(env_name);
        match v.trim().parse::<u64>() {
            Ok(n) if n >= min => n,
            _ => {
                self.errors
                    .push(format!("{from}: `{v}` is not a whole number ≥ {min}"));
                min
            }
        }
    }

    /// A whole number ≥ `min` and ≤ `max`; a larger one is reported as "`<n>` `past_max`".
    pub fn number_at_most(&mut self, env_name: &str, min: u64, max: u64, past_max: &str) -> u64 {
        let n = self.number(env_name, min);
        if n > max {
            let (_, from) = self.get(env_name);
            self.errors.push(format!("{from}: `{n}` {past_max}"));
            return max;
        }
        n
    }

    /// What `parse` makes of the value, or `fallback` with `parse`'s error reported.
    pub fn parsed<T>(
        &mut self,
        env_name: &str,
        parse: impl FnOnce(&str) -> Result<T, String>,
        fallback: T,
    ) -> T {
        let (v, from) = self.get(env_name);
        parse(&v).unwrap_or_else(|e| {
            self.errors.push(format!("{from}: {e}"));
            fallback
        })
    }

    /// On or off: `1`, `true`, `yes`, `on` or `0`, `false`, `no`, `off`, or empty (off).
    pub fn switch(&mut self, env_name: &str) -> bool {
        let (v, from) = self.get(env_name);
        match v.trim().to_ascii_lowercase().as_str() {
            "1" | "true" | "yes" | "on" => true,
            "" | "0" | "false" | "no" | "off" => false,
            _ => {
                self.errors
                    .push(format!("{from}: `{v}` is not 1 (on) or 0 (off)"));
                false
            }
        }
    }

    /// A duration in seconds ≥ `min`, with a fraction if need be (`0.5`): tests and tight
    /// deployments want less than a second.
    pub fn seconds(&mut self, env_name: &str, min: f64) -> std::time::Duration {
        let (v, from) = self.get(env_name);
        match v.trim().parse::<f64>() {
            Ok(n) if n.is_finite() && n >= min && n < 1e9 => std::time::Duration::from_secs_f64(n),
            _ => {
                self.errors
                    .push(format!("{from}: `{v}` is not a number of seconds ≥ {min}"));
                std::time::Duration::from_secs_f64(min)
            }
        }
    }

    /// A number of seconds ≥ `min` and ≤ `max`; a larger one is reported as "`<v>` `past_max`".
    pub fn seconds_at_most(
        &mut self,
        env_name: &str,
        min: f64,
        max: f64,
        past_max: &str,
    ) -> std::time::Duration {
        let d = self.seconds(env_name, min);
        if d.as_secs_f64() > max {
            let (v, from) = self.get(env_name);
            self.errors.push(format!("{from}: `{v}` {past_max}"));
            return std::time::Duration::from_secs_f64(max);
        }
        d
    }

    /// A URL with one of `schemes` (e.g. `["nats", "tls"]`), or several separated by commas
    /// (the servers of a cluster), each with one of them.
    pub fn url(&mut self, env_name: &str, schemes: &[&str]) -> String {
        let (v, from) = self.get(env_name);
        let each_ok = v.split(',').all(|one| {
            schemes
                .iter()
                .any(|s| one.trim().starts_with(&format!("{s}://")))
        });
        if !each_ok {
            let want = schemes
                .iter()
                .map(|s| format!("{s}://"))
                .collect::<Vec<_>>()
                .join(" or ");
            let shown = delta_protocol::without_credentials(&v);
            self.errors
                .push(format!("{from}: `{shown}` is not a {want} URL"));
        }
        v
    }

    /// The key prefix: letters, digits, `-` or `_`.
    pub fn prefix(&mut self, env_name: &str) -> String {
        let (v, from) = self.get(env_name);
        let valid = !v.is_empty()
            && v.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !valid {
            self.errors
                .push(format!("{from}: `{v}` must be letters, digits, `-` or `_`"));
        }
        v
    }

    /// A directory that must exist.
    pub fn dir(&mut self, env_name: &str, what: &str) -> std::path::PathBuf {
        let (v, from) = self.get(env_name);
        if !std::path::Path::new(&v).is_dir() {
            self.errors
                .push(format!("{from}: `{v}` is not a directory of {what}"));
        }
        v.into()
    }

    /// A file that must be readable, or none when the setting is empty.
    pub fn optional_file(&mut self, env_name: &str, what: &str) -> Option<std::path::PathBuf> {
        let (v, from) = self.get(env_name);
        if v.is_empty() {
            return None;
        }
        if let Err(e) = std::fs::File::open(&v) {
            self.errors
                .push(format!("{from}: cannot read `{v}`, the {what}: {e}"));
        }
        Some(v.into())
    }

    /// The secrets keys (64 hex digits each, separated by commas; the first seals), or none when
    /// the setting is empty.
    pub fn secrets_key(&mut self, env_name: &str) -> Option<Arc<SecretsKey>> {
        let (v, from) = self.get(env_name);
        if v.is_empty() {
            return None;
        }
        match SecretsKey::from_hex(&v) {
            Ok(k) => Some(Arc::new(k)),
            Err(e) => {
                self.errors.push(format!("{from}: {e}"));
                None
            }
        }
    }

    /// How long finished runs are kept (`DELTA_RETENTION`): a [`period`], `None` to keep them
    /// forever (`0` or `off`).
    pub fn period(&mut self, env_name: &str) -> Option<std::time::Duration> {
        let (v, from) = self.get(env_name);
        match period(&v) {
            Ok(p) => p,
            Err(e) => {
                self.errors.push(format!("{from}: {e}"));
                None
            }
        }
    }

    /// The errors, if any: `Err` with all of them.
    pub fn finish(self) -> Result<(), Vec<String>> {
        if self.errors.is_empty() {
            Ok(())
        } else {
            Err(self.errors)
        }
    }
}

/// Prints a binary's flags, their variables and defaults (for `--help`).
pub fn usage(binary: &str, table: &[Setting]) -> String {
    let mut s =
        format!("{binary} [--flag value]…; flags and their DELTA_* variables (defaults):\n");
    for (env, flag, default) in table {
        if secret_in_flag(env, "").is_some() {
            s.push_str(&format!(
                "  {:<18} {env:<28} (environment only: a secret)\n",
                ""
            ));
        } else {
            s.push_str(&format!("  --{flag:<16} {env:<28} ({default})\n"));
        }
    }
    s
}

/// A period such as `7d`, `36h`, `90m`, `30s` or `1.5d` (a bare number is seconds); `0` or `off`
/// is `None` (forever). The error says what was wrong.
pub fn period(text: &str) -> Result<Option<std::time::Duration>, String> {
    let t = text.trim();
    if t.eq_ignore_ascii_case("off") {
        return Ok(None);
    }
    let (number, unit) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => (&t[..i], c.to_ascii_lowercase()),
        _ => (t, 's'),
    };
    let scale = match unit {
        's' => 1.0,
        'm' => 60.0,
        'h' => 3600.0,
        'd' => 86_400.0,
        _ => f64::NAN,
    };
    let secs = number.trim().parse::<f64>().map(|n| n * scale);
    match secs {
        Ok(0.0) => Ok(None),
        // Up to about 31 years: past that it is "forever" in all but name.
        Ok(s) if s.is_finite() && s > 0.0 && s < 1e9 => {
            Ok(Some(std::time::Duration::from_secs_f64(s)))
        }
        _ => Err(format!(
            "`{text}` is not a period like 7d, 36h, 90m or 30s (or 0/off: keep forever)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A secret, or a URL with a password, is refused as a flag (naming the variable to use
    /// instead) and never kept; the same values from the environment, and harmless flags, pass.
    #[test]
    fn secrets_are_refused_as_flags() {
        const TABLE: &[Setting] = &[
            ("DELTA_GATEWAY_TOKEN", "token", ""),
            ("DELTA_SECRETS_KEY", "secrets-key", ""),
            ("DELTA_NATS_URL", "nats-url", "nats://127.0.0.1:4222"),
            ("DELTA_GATEWAY_TOKENS_FILE", "tokens-file", ""),
        ];
        let args = |a: &[&str]| a.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let env = HashMap::new();
        let s = Settings::parse(
            TABLE,
            &args(&[
                "--token",
                "t0p-s3cret-token-123",
                "--secrets-key=00ff",
                "--nats-url",
                "nats://delta-worker:hunter2@nats:4222",
            ]),
            &env,
        );
        assert_eq!(s.errors.len(), 3, "{:?}", s.errors);
        for (e, var) in
            s.errors
                .iter()
                .zip(["DELTA_GATEWAY_TOKEN", "DELTA_SECRETS_KEY", "DELTA_NATS_URL"])
        {
            assert!(e.contains(var) && e.contains("`ps`"), "{e}");
            assert!(!e.contains("hunter2") && !e.contains("t0p-s3cret"), "{e}");
        }
        assert_eq!(s.get("DELTA_GATEWAY_TOKEN").0, "", "not kept");
        // Any URL of a list: a client logs in with whichever carries a password.
        let s = Settings::parse(
            TABLE,
            &args(&["--nats-url", "nats://a:4222,nats://delta-gateway:pw@b:4222"]),
            &env,
        );
        assert_eq!(s.errors.len(), 1, "{:?}", s.errors);
        let s = Settings::parse(
            TABLE,
            &args(&[
                "--nats-url",
                "nats://nats:4222",
                "--tokens-file",
                "/etc/tokens.yaml",
            ]),
            &env,
        );
        assert!(s.errors.is_empty(), "{:?}", s.errors);
        let env: HashMap<String, String> = [(
            "DELTA_NATS_URL".to_owned(),
            "nats://delta-worker:hunter2@nats:4222".to_owned(),
        )]
        .into();
        let s = Settings::parse(TABLE, &[], &env);
        assert!(s.errors.is_empty(), "{:?}", s.errors);
        assert!(s.get("DELTA_NATS_URL").0.contains("hunter2"));
    }

    #[test]
    fn periods_read_as_an_operator_writes_them() {
        let h = |n: u64| Some(Duration::from_secs(n * 3600));
        assert_eq!(period("7d"), Ok(h(7 * 24)));
        assert_eq!(period("36h"), Ok(h(36)));
        assert_eq!(period(" 90M "), Ok(Some(Duration::from_secs(5400))));
        assert_eq!(period("30s"), Ok(Some(Duration::from_secs(30))));
        assert_eq!(period("2"), Ok(Some(Duration::from_secs(2))));
        assert_eq!(period("0.5"), Ok(Some(Duration::from_millis(500))));
        assert_eq!(period("1.5d"), Ok(h(36)));
        for forever in ["0", "0d", "off", "OFF"] {
            assert_eq!(period(forever), Ok(None), "{forever}");
        }
        for bad in ["", "d", "7w", "-1d", "seven days", "1e12d", "NaN", "inf"] {
            assert!(period(bad).is_err(), "{bad}");
        }
    }
}

/// Where the fleet's servers are and how to use them: the settings the gateway and the workers
/// share (`DELTA_NATS_URL`, `DELTA_REDIS_URL`, their CA files, `DELTA_KEY_PREFIX`,
/// `DELTA_STREAM_REPLICAS`, `DELTA_REDIS_CLUSTER`, `DELTA_REDIS_BUCKETS`,
/// `DELTA_REDIS_DURABILITY`), read the same way by both ([`Settings::servers`]).
#[derive(Clone, Debug)]
pub struct Servers {
    pub nats_url: String,
    pub redis_url: String,
    pub nats_ca: Option<std::path::PathBuf>,
    pub redis_ca: Option<std::path::PathBuf>,
    pub prefix: String,
    /// Copies JetStream keeps of each stream.
    pub stream_replicas: usize,
    /// `redis_url` lists seed nodes of a Redis Cluster.
    pub redis_cluster: bool,
    /// `None`: the count Redis holds (16 on one Redis, 64 on a cluster for a new deployment).
    pub redis_buckets: Option<u32>,
    pub durability: Durability,
}

impl Settings<'_> {
    /// The server settings every program of the fleet reads ([`Servers`]); the table must name
    /// each of them.
    pub fn servers(&mut self) -> Servers {
        let nats_url = self.url("DELTA_NATS_URL", &["nats", "tls"]);
        let redis_url = self.url("DELTA_REDIS_URL", &["redis", "rediss"]);
        let nats_ca = self.optional_file("DELTA_NATS_CA_FILE", "CA certificates (PEM) of NATS");
        let redis_ca = self.optional_file("DELTA_REDIS_CA_FILE", "CA certificates (PEM) of Redis");
        let prefix = self.prefix("DELTA_KEY_PREFIX");
        let replicas = self.number_at_most(
            "DELTA_STREAM_REPLICAS",
            1,
            5,
            "replicas: JetStream keeps at most 5 copies of a stream (3 on a cluster of three)",
        );
        // Unset: the count Redis holds, or for a new deployment 16 (one Redis) or 64 (a cluster).
        let buckets = (!self.get("DELTA_REDIS_BUCKETS").0.trim().is_empty()).then(|| {
            self.number_at_most(
                "DELTA_REDIS_BUCKETS",
                1,
                u64::from(MAX_BUCKETS),
                &format!("buckets: at most {MAX_BUCKETS} (a listing reads every bucket)"),
            )
        });
        let redis_cluster = self.switch("DELTA_REDIS_CLUSTER");
        let durability = self.parsed(
            "DELTA_REDIS_DURABILITY",
            |text| match text {
                // Unset: what keeps an acknowledged write through the loss of one server.
                "" => Ok(Durability::default_for(redis_cluster)),
                text => Durability::parse(text),
            },
            Durability::FsyncAlways,
        );
        Servers {
            nats_url,
            redis_url,
            nats_ca,
            redis_ca,
            prefix,
            stream_replicas: usize::try_from(replicas).unwrap_or(1),
            redis_cluster,
            redis_buckets: buckets.map(|n| u32::try_from(n).unwrap_or(MAX_BUCKETS)),
            durability,
        }
    }
}
