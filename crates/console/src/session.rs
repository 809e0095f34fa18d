//! Logged-in sessions: a random id (the cookie's value) to who logged in, their CSRF token and
//! when the session ends. Held in memory, bounded; a gateway restart logs everyone out.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use access::AccessKey;

/// Sessions held at once; at the bound, expired ones are dropped first, then the oldest.
pub(crate) const SESSIONS_MAX: usize = 10_000;
/// Sessions of one access key at once; a new login past it ends that key's oldest session, so
/// one identity can never push out the others'.
pub(crate) const SESSIONS_PER_KEY_MAX: usize = 64;
/// How often a scoped key's session checks that the key still exists (a revoked key's
/// sessions end within this).
pub(crate) const KEY_RECHECK: Duration = Duration::from_secs(5);

/// Who a session belongs to.
#[derive(Clone, Debug)]
pub(crate) enum Who {
    /// The gateway's root credentials: anything.
    Root { access_key: String },
    /// A scoped key: what `access` allows it.
    Scoped(Arc<AccessKey>),
}

impl Who {
    pub(crate) fn access_key(&self) -> &str {
        match self {
            Who::Root { access_key } => access_key,
            Who::Scoped(key) => &key.id,
        }
    }

    /// Whether this identity may do `action` on `bucket`.
    pub(crate) fn allows(&self, bucket: Option<&str>, action: access::Action) -> bool {
        match self {
            Who::Root { .. } => true,
            Who::Scoped(key) => key.allows(bucket, action),
        }
    }
}

#[derive(Clone, Debug)]
pub(crate) struct Session {
    pub(crate) who: Who,
    /// Sent with every form and upload; compared in constant time.
    pub(crate) csrf: String,
    pub(crate) expires: Instant,
    /// When a scoped key was last found in the cluster.
    pub(crate) checked: Instant,
}

#[derive(Debug)]
pub(crate) struct Sessions {
    ttl: Duration,
    by_id: Mutex<HashMap<String, Session>>,
}

/// 32 random bytes, hex: a session id or a CSRF token.
fn token() -> String {
    hex::encode(rand::random::<[u8; 32]>())
}

impl Sessions {
    pub(crate) fn new(ttl: Duration) -> Self {
        Self { ttl, by_id: Mutex::new(HashMap::new()) }
    }

    pub(crate) fn ttl(&self) -> Duration {
        self.ttl
    }

    /// A new session for `who`; returns its id.
    pub(crate) fn create(&self, who: Who) -> String {
        let now = Instant::now();
        let mut by_id = self.by_id.lock().expect("sessions lock poisoned");
        let mine: Vec<(Instant, String)> = by_id
            .iter()
            .filter(|(_, s)| s.who.access_key() == who.access_key())
            .map(|(id, s)| (s.expires, id.clone()))
            .collect();
        if mine.len() >= SESSIONS_PER_KEY_MAX {
            let oldest = mine.into_iter().min().map(|(_, id)| id).expect("at least one");
            by_id.remove(&oldest);
        }
        if by_id.len() >= SESSIONS_MAX {
            by_id.retain(|_, session| session.expires > now);
        }
        if by_id.len() >= SESSIONS_MAX {
            let oldest = by_id.iter().min_by_key(|(_, s)| s.expires).map(|(id, _)| id.clone());
            if let Some(oldest) = oldest {
                by_id.remove(&oldest);
            }
        }
        let id = token();
        by_id.insert(id.clone(), Session { who, csrf: token(), expires: now + self.ttl, checked: now });
        assert!(by_id.len() <= SESSIONS_MAX, "sessions stay bounded");
        id
    }

    /// The live session `id`; an expired one is removed and gives `None`.
    pub(crate) fn get(&self, id: &str) -> Option<Session> {
        let mut by_id = self.by_id.lock().expect("sessions lock poisoned");
        let session = by_id.get(id)?;
        if session.expires <= Instant::now() {
            by_id.remove(id);
            return None;
        }
        Some(session.clone())
    }

    /// Records that session `id`'s key was found again now.
    pub(crate) fn checked(&self, id: &str) {
        if let Some(session) = self.by_id.lock().expect("sessions lock poisoned").get_mut(id) {
            session.checked = Instant::now();
        }
    }

    pub(crate) fn remove(&self, id: &str) {
        self.by_id.lock().expect("sessions lock poisoned").remove(id);
    }

    /// Ends every session of scoped key `key_id` (revoked here: its sessions need not wait for
    /// their next check).
    pub(crate) fn end_key(&self, key_id: &str) {
        self.by_id
            .lock()
            .expect("sessions lock poisoned")
            .retain(|_, session| !matches!(&session.who, Who::Scoped(key) if key.id == key_id));
    }
}

/// Constant-time equality of two strings (tokens, secrets).
pub(crate) fn same(a: &str, b: &str) -> bool {
    use subtle::ConstantTimeEq as _;
    a.as_bytes().ct_eq(b.as_bytes()).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_expire_and_stay_bounded() {
        let sessions = Sessions::new(Duration::from_millis(50));
        let id = sessions.create(Who::Root { access_key: "root".into() });
        let session = sessions.get(&id).expect("a fresh session is live");
        assert_eq!(session.csrf.len(), 64);
        assert_ne!(session.csrf, id);
        std::thread::sleep(Duration::from_millis(60));
        assert!(sessions.get(&id).is_none(), "expired");
        let long = Sessions::new(Duration::from_secs(60));
        let root = long.create(Who::Root { access_key: "root".into() });
        let first = long.create(Who::Root { access_key: "other".into() });
        for _ in 0..SESSIONS_PER_KEY_MAX {
            long.create(Who::Root { access_key: "other".into() });
        }
        assert_eq!(long.by_id.lock().unwrap().len(), SESSIONS_PER_KEY_MAX + 1);
        assert!(long.get(&first).is_none(), "that key's oldest made room");
        assert!(long.get(&root).is_some(), "another key's session is untouched");
        for i in 0..SESSIONS_MAX {
            long.create(Who::Root { access_key: format!("key-{i}") });
        }
        assert_eq!(long.by_id.lock().unwrap().len(), SESSIONS_MAX);
    }

    #[test]
    fn tokens_compare_exactly() {
        assert!(same("abc", "abc"));
        assert!(!same("abc", "abd") && !same("abc", "ab") && !same("", "a"));
    }
}
