//! Scoped S3 access keys: keys besides the gateway's root credentials, each limited to some
//! buckets (or all), read-only or read-write, created and revoked while the cluster runs.
//!
//! A key's record lives in the cluster (`client`'s internal bucket of access key records), so
//! every gateway sees the same keys. Its secret is stored sealed: AES-256-GCM under a key
//! derived (HKDF-SHA256) from the cluster secret, with the rest of the record as associated
//! data, so someone who can read or edit drives neither learns a secret nor widens a key's
//! scope without the record failing to open. The gateway needs the secret itself (SigV4 is an
//! HMAC keyed by it), which is why it is sealed and not hashed.
//!
//! What a key may do is [`AccessKey::allows`] of an [`Action`]; [`Action::of_s3_operation`] maps
//! S3 operation names, refusing anything it does not know as [`Action::Admin`] (root only).

use rand::Rng as _;
use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::hkdf::{HKDF_SHA256, Salt};
use serde::{Deserialize, Serialize};

/// What a key may do in its buckets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Permission {
    /// Read and list objects.
    ReadOnly,
    /// Also write and delete objects (not create or delete buckets: root only).
    ReadWrite,
}

impl std::fmt::Display for Permission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Permission::ReadOnly => "read-only",
            Permission::ReadWrite => "read-write",
        })
    }
}

/// The buckets a key reaches.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Buckets {
    /// Every bucket, present and future.
    All,
    /// These buckets (sorted, no duplicates, at least one).
    Only(Vec<String>),
}

impl std::fmt::Display for Buckets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Buckets::All => f.write_str("*"),
            Buckets::Only(names) => f.write_str(&names.join(",")),
        }
    }
}

/// Most buckets one key names.
pub const KEY_BUCKETS_MAX: usize = 100;
/// Longest description, in characters.
pub const DESCRIPTION_CHARS_MAX: usize = 200;
/// Length of the access key ids this crate makes (S3 allows 16 to 128).
pub const ID_LEN: usize = 20;
/// Length of the secrets this crate makes (as AWS's).
pub const SECRET_LEN: usize = 40;
/// Every id this crate makes starts with it, so a log reader tells them from root keys.
pub const ID_PREFIX: &str = "TK";

/// A scoped access key, without its secret.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccessKey {
    pub id: String,
    pub buckets: Buckets,
    pub permission: Permission,
    /// When it was created, in ms since the Unix epoch.
    pub created_ms: u64,
    /// Free text for people ("nightly backup"); never used to decide anything.
    pub description: String,
}

/// What an S3 operation needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Read or list objects of a bucket, or read its settings.
    Read,
    /// Write or delete objects of a bucket.
    Write,
    /// ListBuckets: every key may, and sees only its buckets.
    ListBuckets,
    /// Anything else (create or delete buckets, change their settings): root only.
    Admin,
}

/// Operations that write or delete objects; other names that do not read are [`Action::Admin`].
const WRITE_OPERATIONS: &[&str] = &[
    "AbortMultipartUpload",
    "CompleteMultipartUpload",
    "CopyObject",
    "CreateMultipartUpload",
    "DeleteObject",
    "DeleteObjectTagging",
    "DeleteObjects",
    "PutObject",
    "PutObjectAcl",
    "PutObjectLegalHold",
    "PutObjectRetention",
    "PutObjectTagging",
    "RestoreObject",
    "UploadPart",
    "UploadPartCopy",
];

impl Action {
    /// What the S3 operation `name` (as S3 names it: `GetObject`, ...) needs. An operation
    /// this list does not know needs [`Action::Admin`], so a new one is refused to scoped keys
    /// until someone decides otherwise.
    pub fn of_s3_operation(name: &str) -> Action {
        if name == "ListBuckets" {
            Action::ListBuckets
        } else if WRITE_OPERATIONS.contains(&name) {
            Action::Write
        } else if name.starts_with("Get")
            || name.starts_with("Head")
            || name.starts_with("List")
            || name == "SelectObjectContent"
        {
            Action::Read
        } else {
            Action::Admin
        }
    }
}

impl AccessKey {
    /// Whether this key may do `action` on `bucket` (`None`: no bucket named, as ListBuckets).
    pub fn allows(&self, bucket: Option<&str>, action: Action) -> bool {
        match (action, bucket) {
            (Action::ListBuckets, _) => true,
            (Action::Admin, _) | (Action::Read | Action::Write, None) => false,
            (Action::Read, Some(bucket)) => self.reaches(bucket),
            (Action::Write, Some(bucket)) => self.permission == Permission::ReadWrite && self.reaches(bucket),
        }
    }

    /// Whether `bucket` is one of this key's (what a ListBuckets with it shows).
    pub fn reaches(&self, bucket: &str) -> bool {
        match &self.buckets {
            Buckets::All => true,
            Buckets::Only(names) => names.iter().any(|name| name == bucket),
        }
    }
}

/// A key's secret; its `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// Everything managing keys can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Cluster(#[from] client::Error),
    #[error("no access key {0}")]
    NoSuchKey(String),
    #[error("{0}")]
    InvalidScope(String),
    #[error(
        "access key {id}: its secret does not open (the record was changed, or sealed under another cluster secret)"
    )]
    Unsealable { id: String },
    #[error("access key {id}: unreadable record: {reason}")]
    BadRecord { id: String, reason: String },
    #[error("the cluster holds {0} access keys, the most it keeps; revoke some first")]
    TooManyKeys(usize),
}

/// The stored record: the key, then its sealed secret.
#[derive(Serialize, Deserialize)]
struct Record {
    format: u32,
    key: AccessKey,
    /// Hex of nonce, ciphertext and tag.
    sealed_secret: String,
}

const RECORD_FORMAT: u32 = 1;

/// Checks and normalizes a scope: bucket names valid, sorted, deduplicated, at least one and at
/// most [`KEY_BUCKETS_MAX`]; a description of printable characters within its bound.
pub fn check_scope(buckets: Buckets, description: &str) -> Result<(Buckets, String), Error> {
    let buckets = match buckets {
        Buckets::All => Buckets::All,
        Buckets::Only(mut names) => {
            names.sort();
            names.dedup();
            if names.is_empty() {
                return Err(Error::InvalidScope("a key needs at least one bucket, or all buckets".into()));
            }
            if names.len() > KEY_BUCKETS_MAX {
                return Err(Error::InvalidScope(format!(
                    "{} buckets: a key names at most {KEY_BUCKETS_MAX}",
                    names.len()
                )));
            }
            for name in &names {
                proto::validate_bucket(name).map_err(|e| Error::InvalidScope(e.to_string()))?;
            }
            Buckets::Only(names)
        }
    };
    if description.chars().count() > DESCRIPTION_CHARS_MAX {
        return Err(Error::InvalidScope(format!("the description is longer than {DESCRIPTION_CHARS_MAX} characters")));
    }
    if description.chars().any(char::is_control) {
        return Err(Error::InvalidScope("the description has control characters".into()));
    }
    Ok((buckets, description.to_owned()))
}

/// Creates, finds, lists and revokes keys in a cluster.
pub struct KeyStore {
    client: client::Client,
    sealing: LessSafeKey,
}

impl std::fmt::Debug for KeyStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyStore").finish_non_exhaustive()
    }
}

impl KeyStore {
    /// The keys of `client`'s cluster, sealed under its cluster secret.
    pub fn new(client: client::Client) -> Self {
        let sealing = sealing_key(&client.map().secret);
        Self { client, sealing }
    }

    /// Makes a new key; its secret is in the answer and nowhere else in clear.
    pub async fn create(
        &self,
        buckets: Buckets,
        permission: Permission,
        description: &str,
    ) -> Result<(AccessKey, Secret), Error> {
        let (buckets, description) = check_scope(buckets, description)?;
        let held = self.client.access_key_ids().await?.len();
        if held >= client::KEY_RECORDS_MAX {
            return Err(Error::TooManyKeys(held));
        }
        let key = AccessKey { id: new_id(), buckets, permission, created_ms: now_ms(), description };
        let secret = Secret(random_chars(SECRET_LEN, ALPHANUMERIC));
        let record = seal(&self.sealing, &key, &secret);
        self.client.put_access_key_record(&key.id, &record).await?;
        Ok((key, secret))
    }

    /// The key `id` and its secret; `None` when there is no such key (or it was revoked).
    pub async fn find(&self, id: &str) -> Result<Option<(AccessKey, Secret)>, Error> {
        if !is_key_id(id) {
            return Ok(None);
        }
        match self.client.access_key_record(id).await? {
            None => Ok(None),
            Some(record) => open(&self.sealing, id, &record).map(Some),
        }
    }

    /// Every key, sorted by id, each with its record opened: a record that does not open (a
    /// scope edited on a drive, another cluster's secret) is listed as its error, since
    /// gateways refuse it.
    pub async fn list(&self) -> Result<Vec<(String, Result<AccessKey, Error>)>, Error> {
        let records = self.client.access_key_records().await?;
        Ok(records
            .into_iter()
            .map(|(id, record)| {
                let opened = open(&self.sealing, &id, &record).map(|(key, _secret)| key);
                (id, opened)
            })
            .collect())
    }

    /// Revokes `id`: gateways refuse it once their cache of it expires.
    pub async fn revoke(&self, id: &str) -> Result<(), Error> {
        if !is_key_id(id) || !self.client.delete_access_key_record(id).await? {
            return Err(Error::NoSuchKey(id.to_owned()));
        }
        Ok(())
    }
}

/// Whether `id` has the shape of the ids this crate makes ([`ID_PREFIX`], then uppercase
/// letters and digits, [`ID_LEN`] in all). Anything else is no key: a gateway answers it
/// without asking the cluster or caching it.
pub fn is_key_id(id: &str) -> bool {
    id.len() == ID_LEN && id.starts_with(ID_PREFIX) && id.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit())
}

const UPPERCASE_DIGITS: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
const ALPHANUMERIC: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

fn random_chars(len: usize, alphabet: &[u8]) -> String {
    let mut rng = rand::rngs::OsRng;
    (0..len).map(|_| char::from(alphabet[rng.gen_range(0..alphabet.len())])).collect()
}

fn new_id() -> String {
    format!("{ID_PREFIX}{}", random_chars(ID_LEN - ID_PREFIX.len(), UPPERCASE_DIGITS))
}

fn now_ms() -> u64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
}

/// The AES-256-GCM key for secrets at rest, derived from the cluster secret.
fn sealing_key(cluster_secret: &str) -> LessSafeKey {
    struct KeyLen;
    impl ring::hkdf::KeyType for KeyLen {
        fn len(&self) -> usize {
            AES_256_GCM.key_len()
        }
    }
    let prk = Salt::new(HKDF_SHA256, b"tessera access key secrets").extract(cluster_secret.as_bytes());
    let okm = prk.expand(&[b"aes-256-gcm v1"], KeyLen).expect("32 bytes is a valid HKDF-SHA256 output length");
    let mut bytes = [0u8; 32];
    okm.fill(&mut bytes).expect("the output length is the buffer's");
    LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &bytes).expect("32 bytes is an AES-256 key"))
}

/// What the seal authenticates besides the secret: the record format and the whole key, so a
/// record whose scope was edited does not open. A new field of [`AccessKey`] changes this, so
/// it comes with a new [`RECORD_FORMAT`] (and this function then rebuilds older formats' data).
fn associated_data(key: &AccessKey) -> Vec<u8> {
    let mut data = format!("tessera access key record {RECORD_FORMAT}\0").into_bytes();
    data.extend(serde_json::to_vec(key).expect("an access key serializes"));
    data
}

fn seal(sealing: &LessSafeKey, key: &AccessKey, secret: &Secret) -> Vec<u8> {
    let nonce: [u8; NONCE_LEN] = rand::random();
    let mut sealed = secret.0.as_bytes().to_vec();
    sealing
        .seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce), Aad::from(associated_data(key)), &mut sealed)
        .expect("a 40-byte secret is within AES-GCM's bound");
    let mut stored = nonce.to_vec();
    stored.extend_from_slice(&sealed);
    let record = Record { format: RECORD_FORMAT, key: key.clone(), sealed_secret: hex::encode(stored) };
    serde_json::to_vec(&record).expect("a record serializes")
}

fn parse(id: &str, bytes: &[u8]) -> Result<Record, Error> {
    let bad = |reason: String| Error::BadRecord { id: id.to_owned(), reason };
    let record: Record = serde_json::from_slice(bytes).map_err(|e| bad(e.to_string()))?;
    if record.format != RECORD_FORMAT {
        return Err(bad(format!("format {} (this build reads {RECORD_FORMAT})", record.format)));
    }
    if record.key.id != id {
        return Err(bad(format!("it is the record of {}", record.key.id)));
    }
    Ok(record)
}

fn open(sealing: &LessSafeKey, id: &str, bytes: &[u8]) -> Result<(AccessKey, Secret), Error> {
    let record = parse(id, bytes)?;
    let unsealable = || Error::Unsealable { id: id.to_owned() };
    let stored = hex::decode(&record.sealed_secret).map_err(|_| unsealable())?;
    if stored.len() < NONCE_LEN {
        return Err(unsealable());
    }
    let (nonce, sealed) = stored.split_at(NONCE_LEN);
    let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| unsealable())?;
    let mut sealed = sealed.to_vec();
    let opened =
        sealing.open_in_place(nonce, Aad::from(associated_data(&record.key)), &mut sealed).map_err(|_| unsealable())?;
    let secret = String::from_utf8(opened.to_vec()).map_err(|_| unsealable())?;
    Ok((record.key, Secret(secret)))
}

#[cfg(test)]
mod tests;
