//! The Redis ACL users of the fleet's roles (docs/security.md): the least each needs.
//!
//! The gateway and the workers may read and write (scripts included) the keys under their prefix,
//! and ask a Redis Cluster where the slots are (`CLUSTER SLOTS`/`SHARDS`, `ASKING`); nothing
//! else: no administration (`CONFIG`, `ACL`, `DEBUG`, `SHUTDOWN`), no `MONITOR` (which
//! would show every command, answers included), no `KEYS`, `SCAN` or `RANDOMKEY` (key names
//! outside the prefix) nor `DBSIZE`, no `SELECT`/`MOVE` (other databases), no `FLUSHALL` or
//! `SCRIPT FLUSH`, no pub/sub channels, no key outside `<prefix>:*`. Both roles need the same commands, since every
//! state change is a script over the same keys; they are separate users so that each credential
//! can be rotated and revoked on its own, and a server's `ACL LOG` says which role did what. The
//! admin user (operators, `delta bench`, the tests' own checks) may do everything.
//!
//! The launcher writes these into the ACL file of the `redis-server` it starts (`delta dev`, the
//! tests); `deploy/redis/start.sh` writes the same rules for docker-compose.yml (and
//! `deploy/k8s/redis.yaml` for Kubernetes).

/// The `default` user: off, so that a connection must log in as one of the users below. It
/// keeps every right all the same: Redis 7.0 replays the AOF's transactions (a script's writes)
/// as the default user and checks its rights at `EXEC`, so a default user without them loses
/// those writes at restart ("ACLs rules changed between the moment the transaction was
/// accumulated and the EXEC call"). Off, without a password, nobody can log in as it.
pub const DEFAULT_USER: &str = "user default off resetpass ~* &* +@all";

/// A role on Redis.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RedisRole {
    Gateway,
    Worker,
    Admin,
}

impl RedisRole {
    pub const ALL: [RedisRole; 3] = [RedisRole::Gateway, RedisRole::Worker, RedisRole::Admin];

    pub fn name(self) -> &'static str {
        match self {
            RedisRole::Gateway => "gateway",
            RedisRole::Worker => "worker",
            RedisRole::Admin => "admin",
        }
    }
}

/// The ACL rules of `role`, for the keys under `prefix` (every key when `None`: a server of the
/// tests' own, where each test picks its prefix later), without the user name and password.
pub fn rules(prefix: Option<&str>, role: RedisRole) -> String {
    match role {
        RedisRole::Admin => "~* &* +@all".to_owned(),
        RedisRole::Gateway | RedisRole::Worker => {
            let keys = match prefix {
                Some(p) => format!("~{p}:*"),
                None => "~*".to_owned(),
            };
            format!(
                "resetkeys {keys} resetchannels -@all +@read +@write +@scripting +@connection \
                 +@transaction -@admin -@dangerous -script|flush -script|kill -function \
                 -scan -randomkey -dbsize -select -move +cluster|slots +cluster|shards +asking"
            )
        }
    }
}

/// One line of an ACL file: the user `user`, on, with `password` and `role`'s rules.
/// The password must not contain whitespace (ACL files split on it): generate it as hex.
pub fn acl_line(prefix: Option<&str>, role: RedisRole, user: &str, password: &str) -> String {
    format!("user {user} on >{password} {}", rules(prefix, role))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fleet_roles_are_scoped_to_their_prefix_and_denied_administration() {
        let r = rules(Some("delta"), RedisRole::Worker);
        assert!(r.contains("~delta:*"));
        assert!(r.contains("-@admin") && r.contains("-@dangerous"));
        assert!(!r.contains("~*"));
        assert_eq!(
            acl_line(None, RedisRole::Admin, "a", "pw"),
            "user a on >pw ~* &* +@all"
        );
    }
}
