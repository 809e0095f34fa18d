//! One drive (a directory) of a storage node: the data files of object versions, their metadata
//! and the sorted per-bucket key index.
//!
//! Main type: [`Drive`]. A PUT writes chunks into a staging file (`tmp/<version>`) with
//! [`Drive::write_chunk`], then [`Drive::commit`] makes it durable and current; [`Drive::abort`]
//! drops it. Reads open the committed file with [`Drive::open_version`].
//!
//! # Storage scheme
//! One file per object version per drive holds that drive's chunk of every stripe, chunk `s` at
//! offset `s * chunk_bytes`; files are named by version id (32 hex digits), never by key, so no
//! key can reach the file system (no path traversal). Metadata, buckets and the key index live in
//! one redb database (`meta.redb`, a copy-on-write B-tree with atomic, fsynced commits).
//!
//! # Medium assumptions and fsync policy
//! We assume `fsync` makes written bytes and a directory's entries durable and that `rename`
//! within one file system is atomic. A commit: (1) `fsync` the staging file, (2) rename it into
//! `data/`, (3) `fsync` the data directory, (4) commit the metadata in one redb write transaction
//! (redb fsyncs before it returns). A crash before (4) leaves an unreferenced data file, deleted
//! by the sweep in [`Drive::open`]; after (4) the new version is complete. Readers therefore see
//! the old or the new version, never a torn one.
//!
//! ```ignore
//! let drive = Drive::open(Path::new("tessera-data/n1/d1"))?;
//! drive.create_bucket("bkt")?;
//! drive.write_chunk("bkt", version, 0, &chunk)?;
//! drive.commit(&meta, &[])?;
//! ```

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

pub use proto::Staging;
use proto::{BucketEntry, CommitCondition, CommitOutcome, KeyVersions, ListEntry, ObjectMeta, RepairRecord, VersionId};
use redb::{Database, ReadableTable, TableDefinition};

const BUCKETS: TableDefinition<'_, &str, u64> = TableDefinition::new("buckets");
/// `bucket NUL key` -> postcard [`ObjectMeta`] of the drive's current version (maybe a marker).
///
/// Older versions the drive keeps beside the current one (*retained*) live here too, under
/// `bucket NUL key NUL version (16 bytes, big-endian)`: right after the key's own row (keys have
/// no NUL), so one range read finds a key's every version. A replaced version stays (data file
/// and all) until a newer version of the key is known acknowledged and the grace has passed, so
/// a failed overwrite can be rolled back to it and readers that chose it can finish.
const OBJECTS: TableDefinition<'_, &[u8], &[u8]> = TableDefinition::new("objects");
/// Version ids (hex) whose data file is referenced by `OBJECTS`; the sweep keeps only these.
const VERSIONS: TableDefinition<'_, &str, u8> = TableDefinition::new("versions");
/// Versions whose chunks some set positions lack: `version (16 bytes, big-endian)` -> postcard
/// [`proto::RepairRecord`]. (Format 1 drives had a `repair_queue` table nothing read; it is left.)
const REPAIR: TableDefinition<'_, &[u8], &[u8]> = TableDefinition::new("repair");
/// The repair queue by due time: `not_before_ms (8 bytes, big-endian) version (16 bytes)` -> ()
/// for every `REPAIR` entry, so a repair round reads the entries that are due, not the whole
/// queue (issue 37, item 10). Written in the same transaction as `REPAIR`; rebuilt at open if
/// the two disagree in length (a drive from before the index).
const REPAIR_DUE: TableDefinition<'_, &[u8], ()> = TableDefinition::new("repair_due");
/// When a retained version may be deleted (ms since the epoch); keyed like its `OBJECTS` row.
const RETIRE_AT: TableDefinition<'_, &[u8], u64> = TableDefinition::new("retire_at");
/// Data files of versions whose rows [`RETAINED_SETTLED_MAX`] dropped early, kept until their
/// retirement time so that a GET that chose one reads it to the end (issue 37, item 7):
/// `version (16 bytes, big-endian)` -> when to delete the file (ms since the epoch). Their
/// `VERSIONS` entries stay until then (the sweep keeps the files). At most
/// [`RETIRING_FILES_MAX`].
const RETIRING_FILES: TableDefinition<'_, &[u8], u64> = TableDefinition::new("retiring_files");
/// `bucket NUL key` -> the newest version of the key known acknowledged (16 bytes, big-endian).
const FINALIZED: TableDefinition<'_, &[u8], &[u8]> = TableDefinition::new("finalized");
/// Versions rolled back on this drive before it held them: `version (16 bytes, big-endian)` ->
/// when (ms since the epoch, this drive's clock). A commit of a fenced version is refused ([`Error::RolledBack`]):
/// a writer that decided its write failed rolls it back on every drive it sent the commit to,
/// and a commit still queued on a stalled node must not land after that rollback (issue 37;
/// the model's `Fixes::rollback_fences_unknown`). Kept [`FENCE_KEEP_MS`] after the version's
/// time and at most [`FENCES_MAX`].
const FENCES: TableDefinition<'_, &[u8], u64> = TableDefinition::new("fences");
/// Node settings an admin changed at run time (repair mode and rate): name -> value.
const SETTINGS: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("settings");

/// Most retained versions per key on one drive ([`proto::RETAINED_PER_KEY_MAX`]): a commit that
/// would keep more is refused on this drive (see [`RETAINED_SETTLED_MAX`]).
pub use proto::RETAINED_PER_KEY_MAX;

/// Retained versions per key past which the oldest *settled* ones go early (before their
/// grace): those older than the drive's acknowledged floor, which a newer acknowledged version
/// supersedes. Their rows go (no new reader chooses them); their data files stay until the
/// grace ends ([`RETIRING_FILES`]), so a GET that chose one reads it to the end. Rows at or above the floor may be the newest acknowledged version (its finalize
/// may be late or lost), so they are never dropped to make room: only
/// [`RETAINED_PER_KEY_MAX`] bounds them, by refusing commits.
pub const RETAINED_SETTLED_MAX: usize = 8;

/// Most data files a drive keeps past their rows ([`RETIRING_FILES`]); past it the oldest
/// versions' files go at once (a GET still reading one of them fails; only a drive whose hot
/// keys are overwritten faster than this many times per retire grace gets there).
pub const RETIRING_FILES_MAX: u64 = 16_384;

/// How long after a version's time (its id's clock) this drive keeps the fence a rollback of
/// it left: a commit that a stalled node holds for longer than this lands (and, unreadable,
/// is collected by the scrubber as a failed write's leftover).
pub const FENCE_KEEP_MS: u64 = 24 * 3600 * 1000;
/// Most fences a drive keeps; past it the oldest versions' go first. Only failed writes leave
/// fences, one per drive each (16 + 8 bytes of key and value).
pub const FENCES_MAX: u64 = 1 << 20;

/// Name of the file that marks a directory as a Tessera drive.
pub const DRIVE_MARKER: &str = "tessera-drive";
const DRIVE_MARKER_TEXT: &str = "tessera drive format 1\n";
/// File in a drive's root naming the cluster it belongs to.
const DRIVE_LABEL: &str = "cluster-id";

/// What a drive operation can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("drive {path} does not exist (create it with `tessera init`)")]
    DriveMissing { path: PathBuf },
    #[error("drive {path} is not usable: {source}")]
    DriveUnusable { path: PathBuf, source: io::Error },
    #[error("drive {path} is full")]
    DiskFull { path: PathBuf },
    #[error("no such bucket {bucket:?}")]
    NoSuchBucket { bucket: String },
    #[error("bucket {bucket:?} is not empty")]
    BucketNotEmpty { bucket: String },
    #[error("no staged data for version {version} (the PUT was aborted or never wrote here)")]
    NoStagedData { version: String },
    #[error("no data file of version {version} to re-stamp (its commit did not land on this drive)")]
    NoDataToRestamp { version: String },
    #[error("staged data for version {version} holds {found} bytes, the layout needs {expected}")]
    StagedLengthMismatch { version: String, found: u64, expected: u64 },
    #[error("I/O on drive {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("metadata database of drive {path}: {source}")]
    Db { path: PathBuf, source: Box<redb::Error> },
    #[error("stored metadata on drive {path} is corrupt: {source}")]
    CorruptMeta { path: PathBuf, source: proto::Error },
    #[error("{bucket}/{key} already exists (the commit asked for an absent key)")]
    PreconditionFailed { bucket: String, key: String },
    #[error("staged data for version {version} does not match its checksums at stripe {stripe}")]
    StagedChecksumMismatch { version: String, stripe: u64 },
    #[error("version {version}'s data file is being deleted on drive {path}; try again")]
    VersionBusy { path: PathBuf, version: String },
    #[error("version {version} was rolled back on drive {path} (its write failed); its commit is refused")]
    RolledBack { path: PathBuf, version: String },
    #[error("{bucket}/{key} has {max} versions on drive {path} that no acknowledged version supersedes yet; try again")]
    TooManyVersions { path: PathBuf, bucket: String, key: String, max: usize },
}

/// Replaces the file at `path` with `bytes` so that a crash leaves the old file or the new one,
/// never a mix: a temporary file beside it (created with `mode`), fsynced, renamed over it, and
/// the directory fsynced. For the small files kept beside drives: drive labels, cluster maps.
/// Several processes may replace one file at once (the nodes of one host sharing a
/// `cluster.toml`): each writes its own temporary file.
pub fn write_durably(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let name = path.file_name().ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no file name"))?;
    static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let unique = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.join(format!(".{}.{}.{unique}.tmp", name.to_string_lossy(), std::process::id()));
    let written = (|| {
        let mut file = fs::OpenOptions::new().write(true).create_new(true).mode(mode).open(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = fs::remove_file(&tmp); // best effort: a stray temporary file holds no state
    }
    written?;
    File::open(dir)?.sync_all()
}

/// When a commit's metadata transaction reaches the disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetaSync {
    /// Before the call returns.
    Now,
    /// Neither the data file nor the metadata is fsynced: [`Drive::sync_deferred`] makes
    /// both durable, data first. Until then a crash may lose the metadata (the data file is
    /// then swept as unreferenced at the next open), or keep it, carried by another durable
    /// commit, with its data file short or missing. So only a caller that redoes its work
    /// after a crash and checks what it finds (a rebuild from its saved cursor) may defer.
    Deferred,
}

/// One drive directory.
#[derive(Debug)]
pub struct Drive {
    root: PathBuf,
    /// None while the database is being reopened after an I/O error (see [`Drive::db`]).
    db: std::sync::RwLock<Option<std::sync::Arc<Database>>>,
    /// A finalize or a deferred commit was made without fsync since the last durable commit.
    unsynced: std::sync::atomic::AtomicBool,
    /// A deferred commit published a data file without fsync since the last `syncfs`.
    unsynced_data: std::sync::atomic::AtomicBool,
    /// Held across [`Drive::sync_deferred`].
    syncing: std::sync::Mutex<()>,
    /// Times the database was dropped after an I/O error (commits not yet durable may be lost).
    deferred_losses: std::sync::atomic::AtomicU64,
    /// I/O and database errors the drive has hit since it was opened (a full disk included).
    errors: std::sync::atomic::AtomicU64,
    /// Taken shared by chunk writes and commits, exclusive by [`Drive::wipe`]: a wipe never
    /// runs between a commit's rename of its data file and its metadata transaction.
    wiping: std::sync::RwLock<()>,
    /// Versions whose data file is being published or deleted (see [`FileGuards`]).
    file_guards: std::sync::Mutex<FileGuards>,
}

/// A version's data file is published (staged file renamed in, then its metadata committed)
/// and deleted (its row dropped in a transaction, then the file unlinked) in two steps each; for
/// one version the two must not interleave, or a file just published for a version moved back
/// to this drive could be unlinked by the retirement of the same version's old row. A deleter
/// leaves a file that is being published alone (the publisher's row will name it); a publisher
/// refuses while the file is being deleted (the commit fails on this drive and is retried).
#[derive(Debug, Default)]
struct FileGuards {
    publishing: std::collections::HashSet<VersionId>,
    deleting: std::collections::HashSet<VersionId>,
}

/// Held while a version's data file is published; see [`FileGuards`].
struct Publishing<'a> {
    drive: &'a Drive,
    version: VersionId,
}

impl Drop for Publishing<'_> {
    fn drop(&mut self) {
        self.drive
            .file_guards
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .publishing
            .remove(&self.version);
    }
}

impl Drive {
    /// Prepares an empty drive directory (creating it) for [`Drive::open`]; idempotent.
    pub fn format(root: &Path) -> Result<(), Error> {
        let unusable = |source| Error::DriveUnusable { path: root.to_owned(), source };
        fs::create_dir_all(root).map_err(unusable)?;
        let marker = root.join(DRIVE_MARKER);
        if !marker.exists() {
            fs::write(&marker, DRIVE_MARKER_TEXT).map_err(unusable)?;
        }
        Ok(())
    }

    /// The label a drive directory was given ([`Drive::set_label`]): the id of the cluster it
    /// belongs to. `None` for a drive never labelled. Reads nothing else, changes nothing.
    pub fn label(root: &Path) -> Result<Option<String>, Error> {
        match fs::read_to_string(root.join(DRIVE_LABEL)) {
            Ok(text) => Ok(Some(text.trim().to_owned())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(Error::DriveUnusable { path: root.to_owned(), source }),
        }
    }

    /// Labels a formatted drive directory durably (see [`Drive::label`]).
    pub fn set_label(root: &Path, label: &str) -> Result<(), Error> {
        write_durably(&root.join(DRIVE_LABEL), format!("{label}\n").as_bytes(), 0o644)
            .map_err(|source| Error::DriveUnusable { path: root.to_owned(), source })
    }

    /// Opens a formatted drive, checks it is writable, and sweeps staging files and data files
    /// that no committed metadata references (left by crashes or failed PUTs).
    pub fn open(root: &Path) -> Result<Self, Error> {
        if !root.join(DRIVE_MARKER).is_file() {
            return Err(Error::DriveMissing { path: root.to_owned() });
        }
        let unusable = |source| Error::DriveUnusable { path: root.to_owned(), source };
        let probe = root.join(".write-probe");
        fs::write(&probe, b"probe").and_then(|()| fs::remove_file(&probe)).map_err(unusable)?;
        fs::create_dir_all(root.join("tmp")).map_err(unusable)?;
        for shard in 0..=255u8 {
            fs::create_dir_all(root.join("data").join(format!("{shard:02x}"))).map_err(unusable)?;
        }
        let db = Database::create(root.join(META_FILE)).map_err(|e| db_error(root, e))?;
        let drive = Self {
            root: root.to_owned(),
            db: std::sync::RwLock::new(Some(std::sync::Arc::new(db))),
            unsynced: std::sync::atomic::AtomicBool::new(false),
            // A process that stopped without syncing (kill -9) may have left published files
            // in the page cache only: the first sync after opening syncs the file system.
            unsynced_data: std::sync::atomic::AtomicBool::new(true),
            syncing: std::sync::Mutex::new(()),
            deferred_losses: std::sync::atomic::AtomicU64::new(0),
            errors: std::sync::atomic::AtomicU64::new(0),
            wiping: std::sync::RwLock::new(()),
            file_guards: std::sync::Mutex::new(FileGuards::default()),
        };
        drive.create_tables()?;
        drive.sweep()?;
        Ok(drive)
    }

    /// The drive's directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Creates `bucket` (idempotent: a bucket that exists costs a read, not a durable write).
    pub fn create_bucket(&self, bucket: &str) -> Result<(), Error> {
        if self.has_bucket(bucket)? {
            return Ok(());
        }
        let txn = self.db()?.begin_write().map_err(|e| self.db_err(e))?;
        {
            let mut table = txn.open_table(BUCKETS).map_err(|e| self.db_err(e))?;
            if table.get(bucket).map_err(|e| self.db_err(e))?.is_none() {
                table.insert(bucket, unix_ms()).map_err(|e| self.db_err(e))?;
            }
        }
        txn.commit().map_err(|e| self.db_err(e))
    }

    /// Removes `bucket` and its delete markers; fails if any live object remains.
    pub fn delete_bucket(&self, bucket: &str) -> Result<(), Error> {
        let txn = self.db()?.begin_write().map_err(|e| self.db_err(e))?;
        let mut dropped = Vec::new();
        {
            let mut buckets = txn.open_table(BUCKETS).map_err(|e| self.db_err(e))?;
            if buckets.remove(bucket).map_err(|e| self.db_err(e))?.is_none() {
                return Err(Error::NoSuchBucket { bucket: bucket.to_owned() });
            }
            let mut objects = txn.open_table(OBJECTS).map_err(|e| self.db_err(e))?;
            let (start, end) = bucket_bounds(bucket);
            let mut markers = Vec::new();
            for entry in objects.range(start.as_slice()..end.as_slice()).map_err(|e| self.db_err(e))? {
                let (key, value) = entry.map_err(|e| self.db_err(e))?;
                if is_retained_row(key.value(), bucket.len()) {
                    continue;
                }
                let meta = self.decode_meta(value.value())?;
                if !meta.deleted {
                    return Err(Error::BucketNotEmpty { bucket: bucket.to_owned() });
                }
                markers.push(key.value().to_vec());
            }
            for key in markers {
                objects.remove(key.as_slice()).map_err(|e| self.db_err(e))?;
            }
            // Versions the markers replaced, kept for readers: the bucket takes them along.
            let mut retire = txn.open_table(RETIRE_AT).map_err(|e| self.db_err(e))?;
            let mut versions = txn.open_table(VERSIONS).map_err(|e| self.db_err(e))?;
            let mut rows = Vec::new();
            for entry in objects.range(start.as_slice()..end.as_slice()).map_err(|e| self.db_err(e))? {
                let row = entry.map_err(|e| self.db_err(e))?.0.value().to_vec();
                if is_retained_row(&row, bucket.len()) {
                    rows.push(row);
                }
            }
            let mut finalized = txn.open_table(FINALIZED).map_err(|e| self.db_err(e))?;
            let mut finalized_rows = Vec::new();
            for entry in finalized.range(start.as_slice()..end.as_slice()).map_err(|e| self.db_err(e))? {
                finalized_rows.push(entry.map_err(|e| self.db_err(e))?.0.value().to_vec());
            }
            for row in finalized_rows {
                finalized.remove(row.as_slice()).map_err(|e| self.db_err(e))?;
            }
            for row in rows {
                dropped.push(self.drop_retained_row(&mut objects, &mut retire, &mut versions, &row)?);
            }
        }
        txn.commit().map_err(|e| self.db_err(e))?;
        self.remove_data_files(&dropped);
        Ok(())
    }

    /// Whether `bucket` exists on this drive.
    pub fn has_bucket(&self, bucket: &str) -> Result<bool, Error> {
        let txn = self.db()?.begin_read().map_err(|e| self.db_err(e))?;
        let table = txn.open_table(BUCKETS).map_err(|e| self.db_err(e))?;
        Ok(table.get(bucket).map_err(|e| self.db_err(e))?.is_some())
    }

    /// Every bucket on this drive with its creation time, sorted by name.
    pub fn list_buckets(&self) -> Result<Vec<BucketEntry>, Error> {
        let txn = self.db()?.begin_read().map_err(|e| self.db_err(e))?;
        let table = txn.open_table(BUCKETS).map_err(|e| self.db_err(e))?;
        let mut buckets = Vec::new();
        for entry in table.iter().map_err(|e| self.db_err(e))? {
            let (name, created_ms) = entry.map_err(|e| self.db_err(e))?;
            buckets.push(BucketEntry { name: name.value().to_owned(), created_ms: created_ms.value() });
        }
        Ok(buckets)
    }

    /// Writes `data` at `offset` of `version`'s staging file (created on first write).
    pub fn write_chunk(&self, bucket: &str, version: VersionId, offset: u64, data: &[u8]) -> Result<(), Error> {
        self.write_staged(Staging::Write, bucket, version, offset, data)
    }

    /// [`Drive::write_chunk`] into the writer's or a repair's staging file of `version`.
    pub fn write_staged(
        &self,
        staging: Staging,
        bucket: &str,
        version: VersionId,
        offset: u64,
        data: &[u8],
    ) -> Result<(), Error> {
        if !self.has_bucket(bucket)? {
            return Err(Error::NoSuchBucket { bucket: bucket.to_owned() });
        }
        let path = self.staging_path(version, staging);
        // Only the first chunk creates the staging file: a later one whose file is gone (the
        // drive was wiped, or the connection that staged it ended) must not leave a file with
        // a hole of zeros where the earlier chunks were.
        let _writing = self.wiping.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        let file = OpenOptions::new().create(offset == 0).write(true).truncate(false).open(&path);
        let result = file.and_then(|file| file.write_all_at(data, offset));
        result.map_err(|source| match source.kind() {
            io::ErrorKind::NotFound if offset > 0 => Error::NoStagedData { version: version.to_hex() },
            _ => self.io_err(&path, source),
        })
    }

    /// Drops `version`'s staging file (the writer's), if any.
    pub fn abort(&self, version: VersionId) -> Result<(), Error> {
        self.abort_staged(version, Staging::Write)
    }

    /// Drops `version`'s staging file of `staging`, if any.
    pub fn abort_staged(&self, version: VersionId, staging: Staging) -> Result<(), Error> {
        let path = self.staging_path(version, staging);
        match fs::remove_file(&path) {
            Err(source) if source.kind() != io::ErrorKind::NotFound => Err(self.io_err(&path, source)),
            _ => Ok(()),
        }
    }

    /// Makes `meta` durable and current unless the drive already has this version or a newer
    /// one, or `condition` fails. The staging file must hold exactly this drive's chunks of the
    /// layout.
    pub fn commit(
        &self,
        meta: &ObjectMeta,
        missing_positions: &[u32],
        condition: CommitCondition,
    ) -> Result<CommitOutcome, Error> {
        self.commit_synced(meta, missing_positions, condition, MetaSync::Now, Staging::Write)
    }

    /// A writer's re-stamp: commits `meta` (a new version id of the object committed here as
    /// `of`) with `of`'s data file linked under its name, as [`Drive::commit`] commits a
    /// staged file. Fails with [`Error::NoDataToRestamp`] when the drive has no data file of `of`
    /// (the writer counts the drive failed). `of` is left as it is: retained below the new
    /// version, it retires as any replaced version does.
    pub fn restamp(&self, meta: &ObjectMeta, of: VersionId, missing_positions: &[u32]) -> Result<CommitOutcome, Error> {
        assert!(of < meta.version, "a re-stamp orders the object later");
        if meta.has_data_file() {
            let source = self.data_path(of);
            let staging = self.staging_path(meta.version, Staging::Write);
            match fs::hard_link(&source, &staging) {
                Ok(()) => {}
                // A retried re-stamp linked it already (nothing else stages under this id).
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    return Err(Error::NoDataToRestamp { version: of.to_hex() });
                }
                Err(e) => return Err(self.io_err(&staging, e)),
            }
        }
        self.commit_synced(meta, missing_positions, CommitCondition::None, MetaSync::Now, Staging::Write)
    }

    fn commit_synced(
        &self,
        meta: &ObjectMeta,
        missing_positions: &[u32],
        condition: CommitCondition,
        sync: MetaSync,
        staging: Staging,
    ) -> Result<CommitOutcome, Error> {
        let _committing = self.wiping.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        if !self.has_bucket(&meta.bucket)? {
            return Err(Error::NoSuchBucket { bucket: meta.bucket.clone() });
        }
        let before = self.get_versions(&meta.bucket, &meta.key)?;
        // Whether a row names this version's data file already (a retried commit of a version
        // retained here): a refused commit then leaves the file to it.
        let held = before.all().any(|m| m.version == meta.version);
        if let Some(current) = before.current {
            if condition == CommitCondition::IfAbsent && !current.deleted && current.version != meta.version {
                self.abort_staged(meta.version, staging)?;
                return Err(Error::PreconditionFailed { bucket: meta.bucket.clone(), key: meta.key.clone() });
            }
            if current.version == meta.version {
                // A retried commit of the version the drive already has.
                self.abort_staged(meta.version, staging)?;
                return Ok(CommitOutcome::Applied { replaced_parts: Vec::new() });
            }
        }
        let has_data = meta.has_data_file();
        // Held until the metadata names the published file (or the commit is refused, and
        // the file is deleted below as this version's, not a later publisher's).
        let publishing = if has_data { Some(self.publishing(meta.version)?) } else { None };
        if has_data {
            self.publish_staged(meta, sync, staging)?;
        }
        // A repair spreads only a version known acknowledged, which no rollback undoes: a fence
        // here (a rollback that missed the version, of a write whose outcome was then completed
        // as unknown) refuses its writer's late commit, never the repair.
        let fenced_ok = staging == Staging::Repair;
        let replaced = self.commit_meta(meta, has_data, missing_positions, condition, sync, fenced_ok);
        drop(publishing);
        match replaced? {
            ReplaceResult::TooMany => {
                if has_data && !held {
                    // Published for this commit only: nothing names it.
                    self.remove_data_file(meta.version);
                }
                Err(Error::TooManyVersions {
                    path: self.root.clone(),
                    bucket: meta.bucket.clone(),
                    key: meta.key.clone(),
                    max: RETAINED_PER_KEY_MAX,
                })
            }
            ReplaceResult::Superseded { current, dropped } => {
                self.remove_data_files(&dropped);
                Ok(CommitOutcome::Superseded { current })
            }
            ReplaceResult::ConditionFailed => {
                if has_data && !held {
                    self.remove_data_file(meta.version);
                }
                Err(Error::PreconditionFailed { bucket: meta.bucket.clone(), key: meta.key.clone() })
            }
            ReplaceResult::Fenced => {
                if has_data && !held {
                    self.remove_data_file(meta.version);
                }
                Err(Error::RolledBack { path: self.root.clone(), version: meta.version.to_hex() })
            }
            ReplaceResult::Applied { replaced_parts, dropped } => {
                self.remove_data_files(&dropped);
                Ok(CommitOutcome::Applied { replaced_parts })
            }
        }
    }

    /// Undoes the commit of `version` (the PUT that wrote it did not reach its write quorum):
    /// if it is current, the newest retained version becomes current again, exactly as before
    /// the commit; if it is retained, it is dropped. Its data file is deleted either way. A
    /// version the drive does not hold is fenced here: its commit, still to come (queued on a
    /// stalled node, or racing this rollback), is refused, so a write its writer gave up cannot
    /// land after the rollback. (A drive that held it has had its one commit.)
    pub fn rollback(&self, bucket: &str, key: &str, version: VersionId) -> Result<(), Error> {
        let txn = self.db()?.begin_write().map_err(|e| self.db_err(e))?;
        let removed = {
            let mut objects = txn.open_table(OBJECTS).map_err(|e| self.db_err(e))?;
            let mut retire = txn.open_table(RETIRE_AT).map_err(|e| self.db_err(e))?;
            let mut versions = txn.open_table(VERSIONS).map_err(|e| self.db_err(e))?;
            let object_key = object_key(bucket, key);
            let current = self.current_row(&objects, &object_key)?;
            let own_key = retained_key(&object_key, version);
            if current.as_ref().is_some_and(|c| c.version == version) {
                match self.newest_retained(&objects, &object_key)? {
                    Some(previous) => {
                        let previous_key = retained_key(&object_key, previous.version);
                        objects.remove(previous_key.as_slice()).map_err(|e| self.db_err(e))?;
                        retire.remove(previous_key.as_slice()).map_err(|e| self.db_err(e))?;
                        let encoded = proto::encode_body(&previous);
                        objects.insert(object_key.as_slice(), encoded.as_slice()).map_err(|e| self.db_err(e))?;
                    }
                    None => {
                        objects.remove(object_key.as_slice()).map_err(|e| self.db_err(e))?;
                    }
                }
                versions.remove(version.to_hex().as_str()).map_err(|e| self.db_err(e))?;
                true
            } else if objects.remove(own_key.as_slice()).map_err(|e| self.db_err(e))?.is_some() {
                retire.remove(own_key.as_slice()).map_err(|e| self.db_err(e))?;
                versions.remove(version.to_hex().as_str()).map_err(|e| self.db_err(e))?;
                true
            } else {
                false
            }
        };
        if !removed {
            self.fence_in(&txn, version)?;
        }
        txn.commit().map_err(|e| self.db_err(e))?;
        if removed {
            self.remove_data_file(version);
        }
        self.abort_staged(version, Staging::Repair)?;
        self.abort(version)
    }

    /// Records that `version` of `bucket/key` is acknowledged (on W drives): retained versions
    /// older than it may be deleted once `grace` has passed (readers that chose them before
    /// finish meanwhile). `missing_positions` (set positions that did not commit it) go to the
    /// repair queue. A lost finalize only delays retirement, so without missing positions the
    /// transaction is not fsynced.
    pub fn finalize(
        &self,
        bucket: &str,
        key: &str,
        version: VersionId,
        missing_positions: &[u32],
        retire_at_ms: u64,
    ) -> Result<(), Error> {
        let mut txn = self.db()?.begin_write().map_err(|e| self.db_err(e))?;
        if missing_positions.is_empty() {
            txn.set_durability(redb::Durability::None);
            self.unsynced.store(true, std::sync::atomic::Ordering::SeqCst);
        }
        {
            let retained = txn.open_table(OBJECTS).map_err(|e| self.db_err(e))?;
            let mut retire = txn.open_table(RETIRE_AT).map_err(|e| self.db_err(e))?;
            let mut finalized = txn.open_table(FINALIZED).map_err(|e| self.db_err(e))?;
            let object_key = object_key(bucket, key);
            let known =
                finalized.get(object_key.as_slice()).map_err(|e| self.db_err(e))?.map(|v| version_of_bytes(v.value()));
            if known.is_none_or(|known| known < version) {
                let bytes = version_bytes(version);
                finalized.insert(object_key.as_slice(), bytes.as_slice()).map_err(|e| self.db_err(e))?;
            }
            let (start, end) = retained_bounds(&object_key);
            let mut older = Vec::new();
            for entry in retained.range(start.as_slice()..end.as_slice()).map_err(|e| self.db_err(e))? {
                let (k, _) = entry.map_err(|e| self.db_err(e))?;
                if version_of_retained_key(k.value()) < version {
                    older.push(k.value().to_vec());
                }
            }
            for k in older {
                if retire.get(k.as_slice()).map_err(|e| self.db_err(e))?.is_none() {
                    retire.insert(k.as_slice(), retire_at_ms).map_err(|e| self.db_err(e))?;
                }
            }
        }
        if !missing_positions.is_empty() {
            self.queue_repair_in(&txn, bucket, key, version, missing_positions)?;
        }
        txn.commit().map_err(|e| self.db_err(e))
    }

    /// Garbage-collects a delete marker that every drive of the key's set holds (the caller
    /// checked): removes the key's row if `version` is still its current version, a delete
    /// marker, with no retained version beside it. The acknowledged floor stays (at least
    /// `version`), so readers and writers still order after the delete and other drives do not
    /// see this one as lacking it. Returns whether the marker went.
    pub fn collect_marker(&self, bucket: &str, key: &str, version: VersionId) -> Result<bool, Error> {
        let txn = self.db()?.begin_write().map_err(|e| self.db_err(e))?;
        let collected = {
            let mut objects = txn.open_table(OBJECTS).map_err(|e| self.db_err(e))?;
            let mut versions = txn.open_table(VERSIONS).map_err(|e| self.db_err(e))?;
            let mut finalized = txn.open_table(FINALIZED).map_err(|e| self.db_err(e))?;
            let object_key = object_key(bucket, key);
            let current = self.current_row(&objects, &object_key)?;
            let is_marker = current.is_some_and(|c| c.version == version && c.deleted);
            if !is_marker || self.newest_retained(&objects, &object_key)?.is_some() {
                false
            } else {
                objects.remove(object_key.as_slice()).map_err(|e| self.db_err(e))?;
                versions.remove(version.to_hex().as_str()).map_err(|e| self.db_err(e))?;
                let known = finalized
                    .get(object_key.as_slice())
                    .map_err(|e| self.db_err(e))?
                    .map(|v| version_of_bytes(v.value()));
                if known.is_none_or(|known| known < version) {
                    let bytes = version_bytes(version);
                    finalized.insert(object_key.as_slice(), bytes.as_slice()).map_err(|e| self.db_err(e))?;
                }
                true
            }
        };
        txn.commit().map_err(|e| self.db_err(e))?;
        Ok(collected)
    }

    /// Moves `bucket/key` off this drive up to `version` (it was copied to another pool, where
    /// it is acknowledged): every version not newer than `version` stops being current and
    /// retires at `retire_at_ms` (a reader that chose one finishes meanwhile), and their repairs
    /// are dropped, so the key leaves the drive's listing and no repair brings it back. Newer
    /// versions stay as they are. An acknowledged floor up to `version` goes too: the key's
    /// newest version (or the delete it stood for) lives in the other pool now, and a floor
    /// left here would claim a version this pool no longer holds. Returns whether anything
    /// changed (a repeated eviction changes nothing).
    pub fn evict(&self, bucket: &str, key: &str, version: VersionId, retire_at_ms: u64) -> Result<bool, Error> {
        let txn = self.db()?.begin_write().map_err(|e| self.db_err(e))?;
        let object_key = object_key(bucket, key);
        let (changed, dropped) = {
            let mut objects = txn.open_table(OBJECTS).map_err(|e| self.db_err(e))?;
            let mut versions = txn.open_table(VERSIONS).map_err(|e| self.db_err(e))?;
            let changed = self.evict_rows(&txn, &mut objects, &object_key, version, retire_at_ms)?;
            // The current row became a retained one, retiring like the others: settled rows
            // past the bound go now; the eviction is never refused (readers' answers carry the
            // newest rows only, marked truncated, when a key has more).
            let dropped = self.bound_retained(&txn, &mut objects, &mut versions, &object_key)?.unwrap_or_default();
            (changed, dropped)
        };
        txn.commit().map_err(|e| self.db_err(e))?;
        self.remove_data_files(&dropped);
        Ok(changed)
    }

    /// [`Drive::evict`]'s changes to the rows of one key, in `txn`.
    fn evict_rows(
        &self,
        txn: &redb::WriteTransaction,
        objects: &mut redb::Table<'_, &[u8], &[u8]>,
        object_key: &[u8],
        version: VersionId,
        retire_at_ms: u64,
    ) -> Result<bool, Error> {
        let mut retire = txn.open_table(RETIRE_AT).map_err(|e| self.db_err(e))?;
        let mut repair = txn.open_table(REPAIR).map_err(|e| self.db_err(e))?;
        let mut finalized = txn.open_table(FINALIZED).map_err(|e| self.db_err(e))?;
        let mut changed = false;
        let floor = finalized.get(object_key).map_err(|e| self.db_err(e))?.map(|v| version_of_bytes(v.value()));
        if floor.is_some_and(|floor| floor <= version) {
            finalized.remove(object_key).map_err(|e| self.db_err(e))?;
            changed = true;
        }
        if let Some(current) = self.current_row(objects, object_key)?.filter(|c| c.version <= version) {
            objects.remove(object_key).map_err(|e| self.db_err(e))?;
            let own_key = retained_key(object_key, current.version);
            let encoded = proto::encode_body(&current);
            objects.insert(own_key.as_slice(), encoded.as_slice()).map_err(|e| self.db_err(e))?;
            changed = true;
        }
        let (start, end) = retained_bounds(object_key);
        let mut older = Vec::new();
        for entry in objects.range(start.as_slice()..end.as_slice()).map_err(|e| self.db_err(e))? {
            let (row, _) = entry.map_err(|e| self.db_err(e))?;
            if version_of_retained_key(row.value()) <= version {
                older.push(row.value().to_vec());
            }
        }
        for row in older {
            // The earlier of the two times: a version retiring already keeps its time.
            let due = retire.get(row.as_slice()).map_err(|e| self.db_err(e))?.map(|at| at.value());
            if due.is_none_or(|due| due > retire_at_ms) {
                retire.insert(row.as_slice(), retire_at_ms).map_err(|e| self.db_err(e))?;
                changed = true;
            }
            let queued_version = version_of_retained_key(&row);
            let queued = version_bytes(queued_version);
            let removed = repair.remove(queued.as_slice()).map_err(|e| self.db_err(e))?.map(|r| r.value().to_vec());
            if let Some(record) = removed {
                changed = true;
                if let Ok(record) = self.decode_repair(&record) {
                    let mut index = txn.open_table(REPAIR_DUE).map_err(|e| self.db_err(e))?;
                    index
                        .remove(due_key(record.not_before_ms, queued_version).as_slice())
                        .map_err(|e| self.db_err(e))?;
                }
            }
        }
        Ok(changed)
    }

    /// Records that set `positions` lack a good copy of `version` of `bucket/key` (merged with
    /// what is queued).
    pub fn queue_repair(
        &self,
        bucket: &str,
        key: &str,
        version: VersionId,
        positions: &[u32],
        kind: proto::RepairKind,
    ) -> Result<(), Error> {
        let txn = self.db()?.begin_write().map_err(|e| self.db_err(e))?;
        self.queue_repair_in(&txn, bucket, key, version, positions)?;
        if kind == proto::RepairKind::Damaged {
            self.update_repair_in(&txn, version, |record| record.kind = proto::RepairKind::Damaged)?;
        }
        txn.commit().map_err(|e| self.db_err(e))
    }

    /// Repair's commit: the staged data of `meta` becomes this drive's data file of the
    /// version, once every block of the staged file matches `crcs` (stripe by stripe: a staging
    /// file that another repair published in between and that was then partly rewritten has
    /// holes, and is refused). If the drive holds the version already, the data file is
    /// replaced (fsync, atomic rename) and the metadata is left as it is; otherwise this is an
    /// ordinary commit whose data file and metadata reach the disk as `sync` says.
    pub fn commit_repair(&self, meta: &ObjectMeta, crcs: &[u32], sync: MetaSync) -> Result<(), Error> {
        if meta.has_data_file() {
            self.check_staged(meta, crcs)?;
        }
        let versions = self.get_versions(&meta.bucket, &meta.key)?;
        if !versions.all().any(|m| m.version == meta.version) {
            return self.commit_synced(meta, &[], CommitCondition::None, sync, Staging::Repair).map(|_| ());
        }
        if meta.has_data_file() {
            let _committing = self.wiping.read().unwrap_or_else(std::sync::PoisonError::into_inner);
            let _publishing = self.publishing(meta.version)?;
            // The metadata naming this file is durable already: so must the file be.
            self.publish_staged(meta, MetaSync::Now, Staging::Repair)?;
        } else {
            self.abort_staged(meta.version, Staging::Repair)?;
        }
        Ok(())
    }

    /// Checks every block of `meta`'s staged file against `crcs`.
    fn check_staged(&self, meta: &ObjectMeta, crcs: &[u32]) -> Result<(), Error> {
        let staging = self.staging_path(meta.version, Staging::Repair);
        let file = self.open_staged(meta.version, Staging::Repair)?;
        let geometry = meta.geometry();
        let block_bytes = meta.block_bytes as usize;
        let mut expected = crcs.iter();
        let mut buf = Vec::new();
        for stripe in 0..geometry.stripes {
            let chunk_len = geometry.chunk_len(stripe);
            buf.resize(chunk_len, 0);
            match file.read_exact_at(&mut buf, geometry.file_offset(stripe)) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                    return Err(Error::StagedChecksumMismatch { version: meta.version.to_hex(), stripe });
                }
                Err(e) => return Err(self.io_err(&staging, e)),
            }
            for block in buf.chunks(block_bytes) {
                if expected.next() != Some(&crc32c::crc32c(block)) {
                    return Err(Error::StagedChecksumMismatch { version: meta.version.to_hex(), stripe });
                }
            }
        }
        if expected.next().is_some() {
            return Err(Error::StagedChecksumMismatch { version: meta.version.to_hex(), stripe: geometry.stripes });
        }
        Ok(())
    }

    /// Every queued repair, by version.
    pub fn repair_queue(&self) -> Result<Vec<(VersionId, RepairRecord)>, Error> {
        self.repairs(u64::MAX, usize::MAX)
    }

    /// Queued repairs that may be tried at `now_ms`, at most `max`.
    /// Corrupt entries are skipped (see [`Drive::drop_corrupt_repairs`]).
    pub fn repairs(&self, now_ms: u64, max: usize) -> Result<Vec<(VersionId, RepairRecord)>, Error> {
        let txn = self.db()?.begin_read().map_err(|e| self.db_err(e))?;
        let table = txn.open_table(REPAIR).map_err(|e| self.db_err(e))?;
        let index = txn.open_table(REPAIR_DUE).map_err(|e| self.db_err(e))?;
        let mut due = Vec::new();
        let end = due_key(now_ms.saturating_add(1), VersionId { unix_ns: 0, writer: 0 });
        let range = if now_ms == u64::MAX { index.range::<&[u8]>(..) } else { index.range(..end.as_slice()) };
        for entry in range.map_err(|e| self.db_err(e))? {
            if due.len() >= max {
                break;
            }
            let (row, _) = entry.map_err(|e| self.db_err(e))?;
            let version = version_of_bytes(&row.value()[8..]);
            let Some(record) = table.get(version_bytes(version).as_slice()).map_err(|e| self.db_err(e))? else {
                continue;
            };
            let Ok(record) = self.decode_repair(record.value()) else { continue };
            if record.not_before_ms <= now_ms {
                due.push((version, record));
            }
        }
        Ok(due)
    }

    /// Deletes repair-queue entries that cannot be decoded (a crash or a bad disk damaged them);
    /// returns how many went. What they named is found again by the scrubber.
    pub fn drop_corrupt_repairs(&self) -> Result<usize, Error> {
        let txn = self.db()?.begin_write().map_err(|e| self.db_err(e))?;
        let dropped = {
            let mut table = txn.open_table(REPAIR).map_err(|e| self.db_err(e))?;
            let mut corrupt = Vec::new();
            for entry in table.iter().map_err(|e| self.db_err(e))? {
                let (version, record) = entry.map_err(|e| self.db_err(e))?;
                if version.value().len() != 16 || self.decode_repair(record.value()).is_err() {
                    corrupt.push(version.value().to_vec());
                }
            }
            for key in &corrupt {
                table.remove(key.as_slice()).map_err(|e| self.db_err(e))?;
            }
            drop(table);
            if !corrupt.is_empty() {
                self.reindex_repairs_in(&txn)?;
            }
            corrupt.len()
        };
        txn.commit().map_err(|e| self.db_err(e))?;
        Ok(dropped)
    }

    /// Empties the repair queue (the drive's pool was removed: what it held lives in other
    /// pools, and nothing reads it here any more); returns how many entries went.
    pub fn clear_repairs(&self) -> Result<usize, Error> {
        let txn = self.db()?.begin_write().map_err(|e| self.db_err(e))?;
        let cleared = {
            let mut table = txn.open_table(REPAIR).map_err(|e| self.db_err(e))?;
            let cleared = redb::ReadableTableMetadata::len(&table).map_err(|e| self.db_err(e))? as usize;
            table.retain(|_, _| false).map_err(|e| self.db_err(e))?;
            let mut index = txn.open_table(REPAIR_DUE).map_err(|e| self.db_err(e))?;
            index.retain(|_, ()| false).map_err(|e| self.db_err(e))?;
            cleared
        };
        txn.commit().map_err(|e| self.db_err(e))?;
        Ok(cleared)
    }

    /// Removes `positions` from `version`'s repair record (the record goes when none are left).
    pub fn repair_done(&self, version: VersionId, positions: &[u32]) -> Result<(), Error> {
        self.update_repair(version, |record| record.positions.retain(|p| !positions.contains(p)))
    }

    /// Puts `version`'s repair off until `not_before_ms` and counts a failed attempt.
    pub fn repair_later(&self, version: VersionId, not_before_ms: u64) -> Result<(), Error> {
        self.update_repair(version, |record| {
            record.attempts = record.attempts.saturating_add(1);
            record.not_before_ms = not_before_ms;
        })
    }

    /// Makes every entry that is waiting out a back-off after failed attempts due now (a peer
    /// it could not reach is back); entries waiting for another holder keep waiting. Returns
    /// how many.
    pub fn repair_retry_now(&self) -> Result<usize, Error> {
        let txn = self.db()?.begin_write().map_err(|e| self.db_err(e))?;
        let woken = {
            let mut table = txn.open_table(REPAIR).map_err(|e| self.db_err(e))?;
            let mut index = txn.open_table(REPAIR_DUE).map_err(|e| self.db_err(e))?;
            let mut due = Vec::new();
            for entry in table.iter().map_err(|e| self.db_err(e))? {
                let (version, record) = entry.map_err(|e| self.db_err(e))?;
                if version.value().len() != 16 {
                    continue;
                }
                let Ok(mut record) = self.decode_repair(record.value()) else { continue };
                if record.attempts > 0 && record.not_before_ms > 0 {
                    let was = record.not_before_ms;
                    record.not_before_ms = 0;
                    due.push((version_of_bytes(version.value()), was, proto::encode_body(&record)));
                }
            }
            for (version, was, record) in &due {
                table.insert(version_bytes(*version).as_slice(), record.as_slice()).map_err(|e| self.db_err(e))?;
                index.remove(due_key(*was, *version).as_slice()).map_err(|e| self.db_err(e))?;
                index.insert(due_key(0, *version).as_slice(), ()).map_err(|e| self.db_err(e))?;
            }
            due.len()
        };
        txn.commit().map_err(|e| self.db_err(e))?;
        Ok(woken)
    }

    /// Puts `version`'s repair off until `not_before_ms` without counting a failure (another
    /// drive is expected to do it first).
    pub fn repair_defer(&self, version: VersionId, not_before_ms: u64) -> Result<(), Error> {
        self.update_repair(version, |record| record.not_before_ms = not_before_ms)
    }

    /// A node setting stored on this drive (repair mode and rate), if set.
    pub fn setting(&self, name: &str) -> Result<Option<Vec<u8>>, Error> {
        let txn = self.db()?.begin_read().map_err(|e| self.db_err(e))?;
        let table = txn.open_table(SETTINGS).map_err(|e| self.db_err(e))?;
        Ok(table.get(name).map_err(|e| self.db_err(e))?.map(|v| v.value().to_vec()))
    }

    /// Stores a node setting on this drive (durably).
    pub fn set_setting(&self, name: &str, value: &[u8]) -> Result<(), Error> {
        self.write_setting(&*self.db()?, name, value)
    }

    /// One durable transaction on `db` that stores setting `name`.
    fn write_setting(&self, db: &Database, name: &str, value: &[u8]) -> Result<(), Error> {
        let txn = db.begin_write().map_err(|e| self.db_err(e))?;
        txn.open_table(SETTINGS).map_err(|e| self.db_err(e))?.insert(name, value).map_err(|e| self.db_err(e))?;
        txn.commit().map_err(|e| self.db_err(e))
    }

    /// Forgets everything the drive holds, for a drive that was replaced or is not trusted and
    /// is rebuilt from its set next: every bucket, version, acknowledged floor, repair entry,
    /// data file and staging file (PUTs staging here fail). Settings stay.
    pub fn wipe(&self) -> Result<(), Error> {
        let _exclusive = self.wiping.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        let txn = self.db()?.begin_write().map_err(|e| self.db_err(e))?;
        txn.delete_table(BUCKETS).map_err(|e| self.db_err(e))?;
        txn.delete_table(OBJECTS).map_err(|e| self.db_err(e))?;
        txn.delete_table(VERSIONS).map_err(|e| self.db_err(e))?;
        txn.delete_table(REPAIR).map_err(|e| self.db_err(e))?;
        txn.delete_table(REPAIR_DUE).map_err(|e| self.db_err(e))?;
        txn.delete_table(RETIRE_AT).map_err(|e| self.db_err(e))?;
        txn.delete_table(FINALIZED).map_err(|e| self.db_err(e))?;
        txn.delete_table(RETIRING_FILES).map_err(|e| self.db_err(e))?;
        txn.commit().map_err(|e| self.db_err(e))?;
        self.create_tables()?;
        // No version is referenced any more: the sweep removes every data and staging file.
        self.sweep()
    }

    fn update_repair(&self, version: VersionId, change: impl FnOnce(&mut RepairRecord)) -> Result<(), Error> {
        let txn = self.db()?.begin_write().map_err(|e| self.db_err(e))?;
        self.update_repair_in(&txn, version, change)?;
        txn.commit().map_err(|e| self.db_err(e))
    }

    fn update_repair_in(
        &self,
        txn: &redb::WriteTransaction,
        version: VersionId,
        change: impl FnOnce(&mut RepairRecord),
    ) -> Result<(), Error> {
        {
            let mut table = txn.open_table(REPAIR).map_err(|e| self.db_err(e))?;
            let mut index = txn.open_table(REPAIR_DUE).map_err(|e| self.db_err(e))?;
            let key = version_bytes(version);
            let record = table.get(key.as_slice()).map_err(|e| self.db_err(e))?.map(|v| v.value().to_vec());
            if let Some(bytes) = record {
                let mut record = self.decode_repair(&bytes)?;
                index.remove(due_key(record.not_before_ms, version).as_slice()).map_err(|e| self.db_err(e))?;
                change(&mut record);
                if record.positions.is_empty() {
                    table.remove(key.as_slice()).map_err(|e| self.db_err(e))?;
                } else {
                    table.insert(key.as_slice(), proto::encode_body(&record).as_slice()).map_err(|e| self.db_err(e))?;
                    index.insert(due_key(record.not_before_ms, version).as_slice(), ()).map_err(|e| self.db_err(e))?;
                }
            }
        }
        Ok(())
    }

    fn queue_repair_in(
        &self,
        txn: &redb::WriteTransaction,
        bucket: &str,
        key: &str,
        version: VersionId,
        positions: &[u32],
    ) -> Result<(), Error> {
        let mut table = txn.open_table(REPAIR).map_err(|e| self.db_err(e))?;
        let mut index = txn.open_table(REPAIR_DUE).map_err(|e| self.db_err(e))?;
        let row = version_bytes(version);
        let existing = table.get(row.as_slice()).map_err(|e| self.db_err(e))?.map(|v| v.value().to_vec());
        let mut record = match existing {
            Some(bytes) => {
                let record = self.decode_repair(&bytes)?;
                index.remove(due_key(record.not_before_ms, version).as_slice()).map_err(|e| self.db_err(e))?;
                record
            }
            None => RepairRecord {
                bucket: bucket.to_owned(),
                key: key.to_owned(),
                queued_ms: unix_ms(),
                ..Default::default()
            },
        };
        record.positions.extend_from_slice(positions);
        record.positions.sort_unstable();
        record.positions.dedup();
        // New knowledge: try at once.
        record.not_before_ms = 0;
        table.insert(row.as_slice(), proto::encode_body(&record).as_slice()).map_err(|e| self.db_err(e))?;
        index.insert(due_key(0, version).as_slice(), ()).map_err(|e| self.db_err(e))?;
        Ok(())
    }

    fn decode_repair(&self, bytes: &[u8]) -> Result<RepairRecord, Error> {
        proto::decode_message(bytes, "repair record")
            .map_err(|source| Error::CorruptMeta { path: self.root.clone(), source })
    }

    /// Reads `len` bytes at `offset` of `version`'s data file (a repair's local source).
    pub fn read_chunk(&self, version: VersionId, offset: u64, len: usize) -> Result<Option<Vec<u8>>, Error> {
        let Some(file) = self.open_version(version)? else {
            return Ok(None);
        };
        let mut buf = vec![0u8; len];
        match file.read_exact_at(&mut buf, offset) {
            Ok(()) => Ok(Some(buf)),
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(None),
            Err(e) => Err(self.io_err(&self.data_path(version), e)),
        }
    }

    /// Makes finalizes and [`MetaSync::Deferred`] commits made without fsync durable, data
    /// files first (one `syncfs` of the drive's file system), then the metadata (any durable
    /// commit carries it); a crash loses at most those since the last call. Cheap when there
    /// are none.
    pub fn sync_deferred(&self) -> Result<(), Error> {
        use std::sync::atomic::Ordering::SeqCst;
        // One caller at a time: a caller that finds the flags clear because another one took
        // them waits here until that one's sync is done.
        let _syncing = self.syncing.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if self.unsynced_data.swap(false, SeqCst) {
            self.syncfs().inspect_err(|_| self.unsynced_data.store(true, SeqCst))?;
        }
        if !self.unsynced.swap(false, SeqCst) {
            return Ok(());
        }
        // On failure the commits are still not durable: flag them again before `db_err`, so a
        // database it drops counts as a loss.
        let failed = |e: redb::Error| {
            self.unsynced.store(true, SeqCst);
            self.db_err(e)
        };
        let db = self.db().inspect_err(|_| self.unsynced.store(true, SeqCst))?;
        let txn = db.begin_write().map_err(|e| failed(e.into()))?;
        txn.commit().map_err(|e| failed(e.into()))
    }

    /// Stores a setting durably, unless [`Drive::deferred_losses`] is no longer `losses`:
    /// then it returns `false` and writes nothing. The write carries every deferred commit
    /// made on the same database before it, so a caller that deferred its commits since it
    /// read `losses` knows they are all durable when this returns `true`.
    pub fn set_setting_unless_lost(&self, name: &str, value: &[u8], losses: u64) -> Result<bool, Error> {
        let db = self.db()?;
        // A database dropped from here on fails this transaction (redb refuses work after an
        // I/O error), so checking once the handle is taken is enough.
        if self.deferred_losses() != losses {
            return Ok(false);
        }
        self.write_setting(&db, name, value)?;
        Ok(true)
    }

    /// How many times commits not yet durable (finalizes, [`MetaSync::Deferred`] commits) may
    /// have been lost since the drive opened: the database was dropped after an I/O error. A
    /// caller that deferred compares it across its work ([`Drive::set_setting_unless_lost`]).
    pub fn deferred_losses(&self) -> u64 {
        self.deferred_losses.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Deletes up to `max` retained versions whose retirement time is before `now_ms` (and the
    /// data files of rows dropped early whose time has come); returns how many went.
    pub fn retire_expired(&self, now_ms: u64, max: usize) -> Result<usize, Error> {
        let txn = self.db()?.begin_write().map_err(|e| self.db_err(e))?;
        let mut gone = Vec::new();
        {
            let mut files = txn.open_table(RETIRING_FILES).map_err(|e| self.db_err(e))?;
            let mut versions = txn.open_table(VERSIONS).map_err(|e| self.db_err(e))?;
            let mut due = Vec::new();
            for entry in files.iter().map_err(|e| self.db_err(e))? {
                let (k, at) = entry.map_err(|e| self.db_err(e))?;
                if at.value() <= now_ms {
                    due.push(version_of_bytes(k.value()));
                    if due.len() >= max {
                        break;
                    }
                }
            }
            for version in due {
                files.remove(version_bytes(version).as_slice()).map_err(|e| self.db_err(e))?;
                versions.remove(version.to_hex().as_str()).map_err(|e| self.db_err(e))?;
                gone.push(version);
            }
        }
        {
            let mut retained = txn.open_table(OBJECTS).map_err(|e| self.db_err(e))?;
            let mut retire = txn.open_table(RETIRE_AT).map_err(|e| self.db_err(e))?;
            let mut versions = txn.open_table(VERSIONS).map_err(|e| self.db_err(e))?;
            let mut due = Vec::new();
            for entry in retire.iter().map_err(|e| self.db_err(e))? {
                let (k, at) = entry.map_err(|e| self.db_err(e))?;
                if at.value() <= now_ms {
                    due.push(k.value().to_vec());
                    if due.len() >= max {
                        break;
                    }
                }
            }
            for k in due {
                gone.push(self.drop_retained_row(&mut retained, &mut retire, &mut versions, &k)?);
            }
        }
        txn.commit().map_err(|e| self.db_err(e))?;
        self.remove_data_files(&gone);
        Ok(gone.len())
    }

    /// The newest version of `bucket/key` this drive was told is acknowledged.
    pub fn finalized(&self, bucket: &str, key: &str) -> Result<Option<VersionId>, Error> {
        let txn = self.db()?.begin_read().map_err(|e| self.db_err(e))?;
        let table = txn.open_table(FINALIZED).map_err(|e| self.db_err(e))?;
        let value = table.get(object_key(bucket, key).as_slice()).map_err(|e| self.db_err(e))?;
        Ok(value.map(|v| version_of_bytes(v.value())))
    }

    /// Every version this drive holds of `bucket/key`: the current one and the retained ones
    /// (`finalized` is left `None`: see [`Drive::finalized`]).
    pub fn get_versions(&self, bucket: &str, key: &str) -> Result<KeyVersions, Error> {
        let txn = self.db()?.begin_read().map_err(|e| self.db_err(e))?;
        self.versions_in(&txn, bucket, key)
    }

    /// [`Drive::get_versions`] with `finalized` filled in ([`Drive::finalized`]), read in one
    /// transaction (what a read asks every drive when there are several pools).
    pub fn get_versions_with_floor(&self, bucket: &str, key: &str) -> Result<KeyVersions, Error> {
        let txn = self.db()?.begin_read().map_err(|e| self.db_err(e))?;
        let mut versions = self.versions_in(&txn, bucket, key)?;
        let table = txn.open_table(FINALIZED).map_err(|e| self.db_err(e))?;
        let value = table.get(object_key(bucket, key).as_slice()).map_err(|e| self.db_err(e))?;
        versions.finalized = value.map(|v| version_of_bytes(v.value()));
        Ok(versions)
    }

    /// [`Drive::get_versions`] (with the floor if asked) without block checksums
    /// ([`KeyVersions::checksums_left_out`]): read past, never decoded into memory.
    pub fn get_versions_brief(&self, bucket: &str, key: &str, with_floor: bool) -> Result<KeyVersions, Error> {
        let txn = self.db()?.begin_read().map_err(|e| self.db_err(e))?;
        let mut versions = self.versions_in_as(&txn, bucket, key, true)?;
        if with_floor {
            let table = txn.open_table(FINALIZED).map_err(|e| self.db_err(e))?;
            let value = table.get(object_key(bucket, key).as_slice()).map_err(|e| self.db_err(e))?;
            versions.finalized = value.map(|v| version_of_bytes(v.value()));
        }
        Ok(versions)
    }

    fn versions_in(&self, txn: &redb::ReadTransaction, bucket: &str, key: &str) -> Result<KeyVersions, Error> {
        self.versions_in_as(txn, bucket, key, false)
    }

    fn versions_in_as(
        &self,
        txn: &redb::ReadTransaction,
        bucket: &str,
        key: &str,
        brief: bool,
    ) -> Result<KeyVersions, Error> {
        let objects = txn.open_table(OBJECTS).map_err(|e| self.db_err(e))?;
        let object_key = object_key(bucket, key);
        // The key's row, then its retained rows (`object_key NUL version`), in one range.
        let mut end = object_key.clone();
        end.push(1);
        let mut current = None;
        let mut retained = Vec::new();
        for entry in objects.range(object_key.as_slice()..end.as_slice()).map_err(|e| self.db_err(e))? {
            let (row, value) = entry.map_err(|e| self.db_err(e))?;
            let meta = if brief {
                ObjectMeta::decode_stored_brief(value.value())
                    .map_err(|source| Error::CorruptMeta { path: self.root.clone(), source })?
            } else {
                self.decode_meta(value.value())?
            };
            if row.value() == object_key.as_slice() { current = Some(meta) } else { retained.push(meta) }
        }
        Ok(KeyVersions {
            current,
            retained,
            finalized: None,
            unavailable: false,
            retained_truncated: false,
            checksums_left_out: brief,
        })
    }

    /// The drive's current metadata of `bucket/key` (a delete marker counts).
    pub fn get_meta(&self, bucket: &str, key: &str) -> Result<Option<ObjectMeta>, Error> {
        let txn = self.db()?.begin_read().map_err(|e| self.db_err(e))?;
        let table = txn.open_table(OBJECTS).map_err(|e| self.db_err(e))?;
        let value = table.get(object_key(bucket, key).as_slice()).map_err(|e| self.db_err(e))?;
        value.map(|v| self.decode_meta(v.value())).transpose()
    }

    /// The length of `version`'s committed data file; `None` if the drive does not have it.
    pub fn data_len(&self, version: VersionId) -> Result<Option<u64>, Error> {
        let path = self.data_path(version);
        match fs::metadata(&path) {
            Ok(meta) => Ok(Some(meta.len())),
            Err(source) if source.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(self.io_err(&path, source)),
        }
    }

    /// Opens the committed data file of `version`; `None` if the drive does not have it.
    pub fn open_version(&self, version: VersionId) -> Result<Option<File>, Error> {
        let path = self.data_path(version);
        match File::open(&path) {
            Ok(file) => Ok(Some(file)),
            Err(source) if source.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(self.io_err(&path, source)),
        }
    }

    /// Keys of `bucket` greater than `start_after` that start with `prefix`, sorted, at most
    /// `limit`; delete markers included (the client merges drives and hides them).
    pub fn list(&self, bucket: &str, prefix: &str, start_after: &str, limit: usize) -> Result<Vec<ListEntry>, Error> {
        if !self.has_bucket(bucket)? {
            return Err(Error::NoSuchBucket { bucket: bucket.to_owned() });
        }
        let txn = self.db()?.begin_read().map_err(|e| self.db_err(e))?;
        let table = txn.open_table(OBJECTS).map_err(|e| self.db_err(e))?;
        let lower = if prefix > start_after { object_key(bucket, prefix) } else { object_key(bucket, start_after) };
        let (_, end) = bucket_bounds(bucket);
        let mut entries = Vec::new();
        for entry in table.range(lower.as_slice()..end.as_slice()).map_err(|e| self.db_err(e))? {
            if entries.len() >= limit {
                break;
            }
            let (row, value) = entry.map_err(|e| self.db_err(e))?;
            if is_retained_row(row.value(), bucket.len()) {
                continue;
            }
            let meta = self.decode_meta(value.value())?;
            if meta.key.as_str() <= start_after {
                continue;
            }
            if !meta.key.starts_with(prefix) {
                break;
            }
            entries.push(ListEntry {
                key: meta.key,
                version: meta.version,
                deleted: meta.deleted,
                size: meta.size,
                etag: meta.etag,
                modified_ms: meta.modified_ms,
            });
        }
        Ok(entries)
    }
}

/// What step (4) of a commit did; `dropped` are versions pushed out of the retained bound,
/// whose data files go once the transaction is durable.
enum ReplaceResult {
    Applied {
        replaced_parts: Vec<String>,
        dropped: Vec<VersionId>,
    },
    /// Kept as a retained version: a newer one is current.
    Superseded {
        current: VersionId,
        dropped: Vec<VersionId>,
    },
    /// `CommitCondition::IfAbsent` and a live version appeared since the first check.
    ConditionFailed,
    /// The key would keep more than [`RETAINED_PER_KEY_MAX`] retained versions: nothing changed.
    TooMany,
    /// A rollback fenced the version: nothing changed.
    Fenced,
}

impl Drive {
    /// Records `version`'s fence in `txn`, and drops fences past [`FENCE_KEEP_MS`] or
    /// [`FENCES_MAX`] (oldest versions first).
    fn fence_in(&self, txn: &redb::WriteTransaction, version: VersionId) -> Result<(), Error> {
        use redb::ReadableTableMetadata as _;
        let now_ms = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0);
        let mut fences = txn.open_table(FENCES).map_err(|e| self.db_err(e))?;
        fences.insert(version_bytes(version).as_slice(), now_ms).map_err(|e| self.db_err(e))?;
        let keep_from_ns = now_ms.saturating_sub(FENCE_KEEP_MS).saturating_mul(1_000_000);
        loop {
            let oldest = fences.first().map_err(|e| self.db_err(e))?.map(|(v, _)| version_of_bytes(v.value()));
            let Some(oldest) = oldest else { break };
            let over = fences.len().map_err(|e| self.db_err(e))? > FENCES_MAX;
            if oldest == version || (oldest.unix_ns >= keep_from_ns && !over) {
                break;
            }
            fences.pop_first().map_err(|e| self.db_err(e))?;
        }
        Ok(())
    }

    /// Whether a rollback of `version` fenced it on this drive (a commit of it is refused).
    pub fn is_fenced(&self, version: VersionId) -> Result<bool, Error> {
        let txn = self.db()?.begin_read().map_err(|e| self.db_err(e))?;
        let fences = txn.open_table(FENCES).map_err(|e| self.db_err(e))?;
        Ok(fences.get(version_bytes(version).as_slice()).map_err(|e| self.db_err(e))?.is_some())
    }

    fn create_tables(&self) -> Result<(), Error> {
        let txn = self.db()?.begin_write().map_err(|e| self.db_err(e))?;
        txn.open_table(BUCKETS).map_err(|e| self.db_err(e))?;
        txn.open_table(OBJECTS).map_err(|e| self.db_err(e))?;
        txn.open_table(FENCES).map_err(|e| self.db_err(e))?;
        txn.open_table(RETIRING_FILES).map_err(|e| self.db_err(e))?;
        txn.open_table(VERSIONS).map_err(|e| self.db_err(e))?;
        txn.open_table(REPAIR).map_err(|e| self.db_err(e))?;
        txn.open_table(RETIRE_AT).map_err(|e| self.db_err(e))?;
        txn.open_table(FINALIZED).map_err(|e| self.db_err(e))?;
        txn.open_table(SETTINGS).map_err(|e| self.db_err(e))?;
        let (queued, indexed) = {
            use redb::ReadableTableMetadata as _;
            let queue = txn.open_table(REPAIR).map_err(|e| self.db_err(e))?;
            let index = txn.open_table(REPAIR_DUE).map_err(|e| self.db_err(e))?;
            (queue.len().map_err(|e| self.db_err(e))?, index.len().map_err(|e| self.db_err(e))?)
        };
        if queued != indexed {
            self.reindex_repairs_in(&txn)?;
        }
        txn.commit().map_err(|e| self.db_err(e))
    }

    /// Rebuilds `REPAIR_DUE` from `REPAIR` (entries that cannot be decoded are left out; the
    /// repair thread drops them).
    fn reindex_repairs_in(&self, txn: &redb::WriteTransaction) -> Result<(), Error> {
        let table = txn.open_table(REPAIR).map_err(|e| self.db_err(e))?;
        let mut index = txn.open_table(REPAIR_DUE).map_err(|e| self.db_err(e))?;
        index.retain(|_, ()| false).map_err(|e| self.db_err(e))?;
        for entry in table.iter().map_err(|e| self.db_err(e))? {
            let (version, record) = entry.map_err(|e| self.db_err(e))?;
            if version.value().len() != 16 {
                continue;
            }
            let Ok(record) = self.decode_repair(record.value()) else { continue };
            let key = due_key(record.not_before_ms, version_of_bytes(version.value()));
            index.insert(key.as_slice(), ()).map_err(|e| self.db_err(e))?;
        }
        Ok(())
    }

    /// Deletes every staging file (no PUT survives a restart) and every data file that no
    /// committed metadata references.
    fn sweep(&self) -> Result<(), Error> {
        let tmp = self.root.join("tmp");
        for entry in fs::read_dir(&tmp).map_err(|e| self.io_err(&tmp, e))? {
            let path = entry.map_err(|e| self.io_err(&tmp, e))?.path();
            fs::remove_file(&path).map_err(|e| self.io_err(&path, e))?;
        }
        let txn = self.db()?.begin_read().map_err(|e| self.db_err(e))?;
        let versions = txn.open_table(VERSIONS).map_err(|e| self.db_err(e))?;
        let mut removed = 0usize;
        for shard in 0..=255u8 {
            let dir = self.root.join("data").join(format!("{shard:02x}"));
            for entry in fs::read_dir(&dir).map_err(|e| self.io_err(&dir, e))? {
                let entry = entry.map_err(|e| self.io_err(&dir, e))?;
                let name = entry.file_name();
                let name = name.to_string_lossy();
                if versions.get(name.as_ref()).map_err(|e| self.db_err(e))?.is_none() {
                    fs::remove_file(entry.path()).map_err(|e| self.io_err(&entry.path(), e))?;
                    removed += 1;
                }
            }
        }
        if removed > 0 {
            tracing::warn!(drive = %self.root.display(), removed, "swept unreferenced data files");
        }
        Ok(())
    }

    /// The staging file of `version`; `NoStagedData` if nothing was staged.
    fn open_staged(&self, version: VersionId, staging_kind: Staging) -> Result<File, Error> {
        let staging = self.staging_path(version, staging_kind);
        match File::open(&staging) {
            Ok(file) => Ok(file),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Err(Error::NoStagedData { version: version.to_hex() }),
            Err(e) => Err(self.io_err(&staging, e)),
        }
    }

    /// Steps (1)-(3) of a commit: fsync the staging file, rename it into place, fsync the dir.
    /// Deferred, neither fsync happens here: [`Drive::sync_deferred`] syncs the file system.
    fn publish_staged(&self, meta: &ObjectMeta, sync: MetaSync, staging_kind: Staging) -> Result<(), Error> {
        let staging = self.staging_path(meta.version, staging_kind);
        let file = self.open_staged(meta.version, staging_kind)?;
        let found = file.metadata().map_err(|e| self.io_err(&staging, e))?.len();
        let geometry = meta.geometry();
        let last = geometry.stripes - 1;
        let expected = geometry.file_offset(last) + geometry.chunk_len(last) as u64;
        if found != expected {
            return Err(Error::StagedLengthMismatch { version: meta.version.to_hex(), found, expected });
        }
        let target = self.data_path(meta.version);
        if sync == MetaSync::Deferred {
            // Start the write-back now without waiting for it, so that the file system sync
            // later finds little left to write.
            // SAFETY: sync_file_range takes a file descriptor, which `file` keeps open.
            let rc = unsafe {
                libc::sync_file_range(std::os::fd::AsRawFd::as_raw_fd(&file), 0, 0, libc::SYNC_FILE_RANGE_WRITE)
            };
            if rc != 0 {
                return Err(self.io_err(&staging, io::Error::last_os_error()));
            }
            fs::rename(&staging, &target).map_err(|e| self.io_err(&target, e))?;
            // After the rename: a sync that took the flag before it then ran after it.
            self.unsynced_data.store(true, std::sync::atomic::Ordering::SeqCst);
            return Ok(());
        }
        file.sync_all().map_err(|e| self.io_err(&staging, e))?;
        fs::rename(&staging, &target).map_err(|e| self.io_err(&target, e))?;
        let dir = target.parent().expect("data files live in a shard directory");
        File::open(dir).and_then(|d| d.sync_all()).map_err(|e| self.io_err(dir, e))
    }

    /// Step (4) of a commit: one redb transaction that makes the version current if it is the
    /// newest (the one it replaces is retained) or retains it beside a newer current one, and
    /// moves the set of referenced data files along.
    fn commit_meta(
        &self,
        meta: &ObjectMeta,
        has_data: bool,
        missing_positions: &[u32],
        condition: CommitCondition,
        sync: MetaSync,
        fenced_ok: bool,
    ) -> Result<ReplaceResult, Error> {
        let mut txn = self.db()?.begin_write().map_err(|e| self.db_err(e))?;
        // Deferred commits come from callers that redo their work, never from writers whose
        // missed positions must be queued durably.
        assert!(sync == MetaSync::Now || missing_positions.is_empty(), "a deferred commit queues no repairs");
        if sync == MetaSync::Deferred {
            txn.set_durability(redb::Durability::None);
            self.unsynced.store(true, std::sync::atomic::Ordering::SeqCst);
        }
        let result = {
            let fences = txn.open_table(FENCES).map_err(|e| self.db_err(e))?;
            if !fenced_ok && fences.get(version_bytes(meta.version).as_slice()).map_err(|e| self.db_err(e))?.is_some() {
                return Ok(ReplaceResult::Fenced);
            }
            drop(fences);
            let mut objects = txn.open_table(OBJECTS).map_err(|e| self.db_err(e))?;
            let object_key = object_key(&meta.bucket, &meta.key);
            let current = self.current_row(&objects, &object_key)?;
            if let Some(current) = &current
                && condition == CommitCondition::IfAbsent
                && !current.deleted
                && current.version != meta.version
            {
                return Ok(ReplaceResult::ConditionFailed);
            }
            let mut versions = txn.open_table(VERSIONS).map_err(|e| self.db_err(e))?;
            if has_data {
                versions.insert(meta.version.to_hex().as_str(), 1).map_err(|e| self.db_err(e))?;
                // A row names the file again: it is no longer only waiting for its readers.
                let mut files = txn.open_table(RETIRING_FILES).map_err(|e| self.db_err(e))?;
                files.remove(version_bytes(meta.version).as_slice()).map_err(|e| self.db_err(e))?;
            }
            let encoded = proto::encode_body(meta);
            // With no current row, the key's acknowledged floor still orders it: a collected
            // delete marker leaves only its floor, and a write older than it must not become
            // current (it would resurrect the key).
            let floor = if current.is_none() {
                let finalized = txn.open_table(FINALIZED).map_err(|e| self.db_err(e))?;
                let floor = finalized.get(object_key.as_slice()).map_err(|e| self.db_err(e))?;
                floor.map(|v| version_of_bytes(v.value())).filter(|f| *f > meta.version)
            } else {
                None
            };
            let result = match current {
                None if floor.is_some() => {
                    // Kept (it is durable, and the writer counts it) but retired at once: no
                    // reader can choose a version below the floor.
                    let own_key = retained_key(&object_key, meta.version);
                    objects.insert(own_key.as_slice(), encoded.as_slice()).map_err(|e| self.db_err(e))?;
                    let now_ms =
                        SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0);
                    let mut retire = txn.open_table(RETIRE_AT).map_err(|e| self.db_err(e))?;
                    retire.insert(own_key.as_slice(), now_ms).map_err(|e| self.db_err(e))?;
                    ReplaceResult::Superseded { current: floor.expect("checked"), dropped: Vec::new() }
                }
                Some(current) if current.version > meta.version => {
                    // A newer version is current: keep ours beside it (it is still durable, and
                    // the newer one may yet be rolled back).
                    let own_key = retained_key(&object_key, meta.version);
                    objects.insert(own_key.as_slice(), encoded.as_slice()).map_err(|e| self.db_err(e))?;
                    ReplaceResult::Superseded { current: current.version, dropped: Vec::new() }
                }
                current => {
                    // The version may be retained here already (evicted from this pool, and
                    // now moved back): one row per version, or retiring it would delete the
                    // data file the current row names.
                    let own_key = retained_key(&object_key, meta.version);
                    if objects.remove(own_key.as_slice()).map_err(|e| self.db_err(e))?.is_some() {
                        let mut retire = txn.open_table(RETIRE_AT).map_err(|e| self.db_err(e))?;
                        retire.remove(own_key.as_slice()).map_err(|e| self.db_err(e))?;
                    }
                    objects.insert(object_key.as_slice(), encoded.as_slice()).map_err(|e| self.db_err(e))?;
                    let replaced_parts =
                        current.iter().flat_map(|c| c.parts.iter().map(|p| p.piece_key.clone())).collect();
                    if let Some(current) = current {
                        let previous_key = retained_key(&object_key, current.version);
                        let previous = proto::encode_body(&current);
                        objects.insert(previous_key.as_slice(), previous.as_slice()).map_err(|e| self.db_err(e))?;
                    }
                    ReplaceResult::Applied { replaced_parts, dropped: Vec::new() }
                }
            };
            let Some(dropped) = self.bound_retained(&txn, &mut objects, &mut versions, &object_key)? else {
                // Dropped uncommitted: the drive keeps what it had.
                return Ok(ReplaceResult::TooMany);
            };
            if !missing_positions.is_empty() {
                self.queue_repair_in(&txn, &meta.bucket, &meta.key, meta.version, missing_positions)?;
            }
            match result {
                ReplaceResult::Applied { replaced_parts, .. } => ReplaceResult::Applied { replaced_parts, dropped },
                ReplaceResult::Superseded { current, .. } => ReplaceResult::Superseded { current, dropped },
                other => other,
            }
        };
        let drops_files = matches!(&result, ReplaceResult::Applied { dropped, .. } | ReplaceResult::Superseded { dropped, .. } if !dropped.is_empty());
        if sync == MetaSync::Deferred && drops_files {
            // The caller deletes the dropped versions' files once this returns: the rows must
            // be gone durably first, and a durable row must not name a file still in the page
            // cache only (this commit's own).
            self.syncfs()?;
            txn.set_durability(redb::Durability::Immediate);
        }
        txn.commit().map_err(|e| self.db_err(e))?;
        Ok(result)
    }

    /// I/O and database errors this drive has hit since it was opened.
    pub fn errors(&self) -> u64 {
        self.errors.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Object versions with data on this drive (current and retained ones, multipart pieces
    /// included; delete markers hold no data): one read of a table's length.
    pub fn version_count(&self) -> Result<u64, Error> {
        self.table_len(VERSIONS)
    }

    /// Versions queued for repair on this drive: one read of a table's length (unlike
    /// [`Drive::repair_queue`], which reads every entry).
    pub fn repair_queue_len(&self) -> Result<u64, Error> {
        self.table_len(REPAIR)
    }

    /// Entries of `table`. For diagnostics, read as often as a monitor likes: a failure is
    /// reported, not counted in [`Drive::errors`] (which counts the drive's real work).
    fn table_len<K: redb::Key + 'static, V: redb::Value + 'static>(
        &self,
        table: TableDefinition<'_, K, V>,
    ) -> Result<u64, Error> {
        use redb::ReadableTableMetadata as _;
        let db = self.db.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        let Some(db) = db else { return Err(db_error(&self.root, redb::Error::PreviousIo)) };
        let txn = db.begin_read().map_err(|e| db_error(&self.root, e))?;
        let table = txn.open_table(table).map_err(|e| db_error(&self.root, e))?;
        table.len().map_err(|e| db_error(&self.root, e))
    }

    /// Free bytes (for an unprivileged writer) and total bytes of the drive's file system.
    pub fn space(&self) -> Result<(u64, u64), Error> {
        let path = std::ffi::CString::new(self.root.as_os_str().as_encoded_bytes())
            .map_err(|e| self.io_err(&self.root, io::Error::new(io::ErrorKind::InvalidInput, e)))?;
        let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: `path` is a NUL-terminated string and `stat` a valid statvfs to fill.
        let rc = unsafe { libc::statvfs(path.as_ptr(), &mut stat) };
        if rc != 0 {
            return Err(self.io_err(&self.root, io::Error::last_os_error()));
        }
        let fragment = stat.f_frsize as u64;
        Ok((stat.f_bavail as u64 * fragment, stat.f_blocks as u64 * fragment))
    }

    /// Flushes the file system that holds the drive.
    fn syncfs(&self) -> Result<(), Error> {
        let synced = File::open(&self.root).and_then(|dir| {
            // SAFETY: syncfs takes a file descriptor, which `dir` keeps open for the call.
            let rc = unsafe { libc::syncfs(std::os::fd::AsRawFd::as_raw_fd(&dir)) };
            if rc == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
        });
        synced.map_err(|e| self.io_err(&self.root, e))
    }

    /// Bounds a key's retained versions without dropping one that may be the newest
    /// acknowledged: past [`RETAINED_SETTLED_MAX`] rows, the oldest rows older than the drive's
    /// acknowledged floor go. A row with a retirement time leaves its data file to
    /// [`RETIRING_FILES`] until then (readers that chose it finish); the others' files (and
    /// those past [`RETIRING_FILES_MAX`]) are returned, for the caller to delete after the
    /// transaction. `None` when more than [`RETAINED_PER_KEY_MAX`] rows would still be kept:
    /// the caller refuses its change (a late commit of an old version, or a key with many
    /// unacknowledged writes), so no acknowledged version is ever dropped to make room.
    fn bound_retained(
        &self,
        txn: &redb::WriteTransaction,
        retained: &mut redb::Table<'_, &[u8], &[u8]>,
        versions: &mut redb::Table<'_, &str, u8>,
        object_key: &[u8],
    ) -> Result<Option<Vec<VersionId>>, Error> {
        let (start, end) = retained_bounds(object_key);
        let mut keys = Vec::new();
        for entry in retained.range(start.as_slice()..end.as_slice()).map_err(|e| self.db_err(e))? {
            keys.push(entry.map_err(|e| self.db_err(e))?.0.value().to_vec());
        }
        let mut dropped = Vec::new();
        let mut rows_dropped = 0;
        if keys.len() > RETAINED_SETTLED_MAX {
            let floor = {
                let finalized = txn.open_table(FINALIZED).map_err(|e| self.db_err(e))?;
                let floor = finalized.get(object_key).map_err(|e| self.db_err(e))?;
                floor.map(|v| version_of_bytes(v.value()))
            };
            // Oldest first (the rows sort by version).
            let settled = keys.iter().take_while(|k| floor.is_some_and(|f| version_of_retained_key(k) < f));
            let excess = keys.len() - RETAINED_SETTLED_MAX;
            let mut retire = txn.open_table(RETIRE_AT).map_err(|e| self.db_err(e))?;
            let mut files = txn.open_table(RETIRING_FILES).map_err(|e| self.db_err(e))?;
            for k in settled.take(excess) {
                rows_dropped += 1;
                let retire_at = retire.get(k.as_slice()).map_err(|e| self.db_err(e))?.map(|at| at.value());
                match retire_at {
                    // A reader may have chosen it before the floor passed it: the row goes (no
                    // new reader finds it), the file stays until its retirement time.
                    Some(at) => {
                        retained.remove(k.as_slice()).map_err(|e| self.db_err(e))?;
                        retire.remove(k.as_slice()).map_err(|e| self.db_err(e))?;
                        let version = version_of_retained_key(k);
                        files.insert(version_bytes(version).as_slice(), at).map_err(|e| self.db_err(e))?;
                    }
                    // Committed below the floor (late): no reader could choose it.
                    None => dropped.push(self.drop_retained_row(retained, &mut retire, versions, k)?),
                }
            }
            use redb::ReadableTableMetadata as _;
            while files.len().map_err(|e| self.db_err(e))? > RETIRING_FILES_MAX {
                let Some((oldest, _)) = files.pop_first().map_err(|e| self.db_err(e))? else { break };
                let version = version_of_bytes(oldest.value());
                versions.remove(version.to_hex().as_str()).map_err(|e| self.db_err(e))?;
                dropped.push(version);
            }
        }
        if keys.len() - rows_dropped > RETAINED_PER_KEY_MAX {
            tracing::warn!(drive = %self.root.display(), "a key has more than {RETAINED_PER_KEY_MAX} versions no acknowledged version supersedes; a commit of it is refused");
            return Ok(None);
        }
        Ok(Some(dropped))
    }

    /// Removes a retained row, its retirement time and its data file's reference; returns the
    /// version, whose data file the caller deletes once the transaction is durable.
    fn drop_retained_row(
        &self,
        objects: &mut redb::Table<'_, &[u8], &[u8]>,
        retire: &mut redb::Table<'_, &[u8], u64>,
        versions: &mut redb::Table<'_, &str, u8>,
        row: &[u8],
    ) -> Result<VersionId, Error> {
        objects.remove(row).map_err(|e| self.db_err(e))?;
        retire.remove(row).map_err(|e| self.db_err(e))?;
        let version = version_of_retained_key(row);
        versions.remove(version.to_hex().as_str()).map_err(|e| self.db_err(e))?;
        Ok(version)
    }

    /// The current version of a key (its row in `objects`), if any.
    fn current_row(
        &self,
        objects: &redb::Table<'_, &[u8], &[u8]>,
        object_key: &[u8],
    ) -> Result<Option<ObjectMeta>, Error> {
        match objects.get(object_key).map_err(|e| self.db_err(e))? {
            Some(value) => Ok(Some(self.decode_meta(value.value())?)),
            None => Ok(None),
        }
    }

    /// The newest retained version of a key, if any.
    fn newest_retained(
        &self,
        retained: &redb::Table<'_, &[u8], &[u8]>,
        object_key: &[u8],
    ) -> Result<Option<ObjectMeta>, Error> {
        let (start, end) = retained_bounds(object_key);
        let newest = retained.range(start.as_slice()..end.as_slice()).map_err(|e| self.db_err(e))?.next_back();
        match newest {
            Some(entry) => Ok(Some(self.decode_meta(entry.map_err(|e| self.db_err(e))?.1.value())?)),
            None => Ok(None),
        }
    }

    fn remove_data_files(&self, versions: &[VersionId]) {
        for version in versions {
            self.remove_data_file(*version);
        }
    }

    fn remove_data_file(&self, version: VersionId) {
        {
            let mut guards = self.file_guards.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if guards.publishing.contains(&version) {
                // Published again under us (the version came back to this drive): the new row
                // names the new file.
                return;
            }
            guards.deleting.insert(version);
        }
        let path = self.data_path(version);
        if let Err(e) = fs::remove_file(&path)
            && e.kind() != io::ErrorKind::NotFound
        {
            // The sweep at the next open removes it; nothing references it any more.
            tracing::warn!(path = %path.display(), error = %e, "could not remove a superseded data file");
        }
        self.file_guards.lock().unwrap_or_else(std::sync::PoisonError::into_inner).deleting.remove(&version);
    }

    /// Marks `version`'s data file as being published until the guard drops; refused while it
    /// is being deleted (see [`FileGuards`]).
    fn publishing(&self, version: VersionId) -> Result<Publishing<'_>, Error> {
        let mut guards = self.file_guards.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if guards.deleting.contains(&version) {
            return Err(Error::VersionBusy { path: self.root.clone(), version: version.to_hex() });
        }
        guards.publishing.insert(version);
        Ok(Publishing { drive: self, version })
    }

    fn staging_path(&self, version: VersionId, staging: Staging) -> PathBuf {
        let tmp = self.root.join("tmp");
        match staging {
            Staging::Write => tmp.join(version.to_hex()),
            Staging::Repair => tmp.join(format!("{}.repair", version.to_hex())),
        }
    }

    fn data_path(&self, version: VersionId) -> PathBuf {
        let hex = version.to_hex();
        // The writer id's last byte is random, so files spread evenly over 256 directories.
        self.root.join("data").join(&hex[30..32]).join(hex)
    }

    fn decode_meta(&self, bytes: &[u8]) -> Result<ObjectMeta, Error> {
        let meta = ObjectMeta::decode_stored(bytes)
            .map_err(|source| Error::CorruptMeta { path: self.root.clone(), source })?;
        meta.validate().map_err(|source| Error::CorruptMeta { path: self.root.clone(), source })?;
        Ok(meta)
    }

    fn io_err(&self, path: &Path, source: io::Error) -> Error {
        self.errors.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if is_disk_full(&source) {
            return Error::DiskFull { path: self.root.clone() };
        }
        Error::Io { path: path.to_owned(), source }
    }

    /// The metadata database. After an I/O error (a full disk, typically) redb refuses every
    /// later transaction until the database is reopened; [`Drive::db_err`] then drops it and
    /// the next call reopens it here (redb recovers to its last durable commit), so a drive
    /// that filled up works again once space is freed, without restarting the node. The reopen
    /// fails while transactions of the old handle are still alive; a later call retries.
    fn db(&self) -> Result<std::sync::Arc<Database>, Error> {
        if let Some(db) = self.db.read().unwrap_or_else(std::sync::PoisonError::into_inner).as_ref() {
            return Ok(db.clone());
        }
        let mut slot = self.db.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(db) = slot.as_ref() {
            return Ok(db.clone());
        }
        // Not `db_err`: it takes this lock, which this thread holds.
        let db = std::sync::Arc::new(Database::create(self.root.join(META_FILE)).map_err(|e| db_error(&self.root, e))?);
        tracing::warn!(drive = %self.root.display(), "metadata database reopened after an I/O error");
        *slot = Some(db.clone());
        Ok(db)
    }

    fn db_err(&self, source: impl Into<redb::Error>) -> Error {
        self.errors.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let source: redb::Error = source.into();
        if matches!(source, redb::Error::Io(_) | redb::Error::PreviousIo) {
            let mut slot = self.db.write().unwrap_or_else(std::sync::PoisonError::into_inner);
            // Whatever was not durable on it may be gone (counted whether or not anything was
            // pending: a sync may have taken the flags and not finished).
            if slot.take().is_some() {
                self.deferred_losses.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        }
        db_error(&self.root, source)
    }
}

const META_FILE: &str = "meta.redb";

fn db_error(root: &Path, source: impl Into<redb::Error>) -> Error {
    let source: redb::Error = source.into();
    if let redb::Error::Io(io) = &source
        && is_disk_full(io)
    {
        return Error::DiskFull { path: root.to_owned() };
    }
    Error::Db { path: root.to_owned(), source: Box::new(source) }
}

fn is_disk_full(error: &io::Error) -> bool {
    error.kind() == io::ErrorKind::StorageFull || error.raw_os_error() == Some(libc::EDQUOT)
}

fn object_key(bucket: &str, key: &str) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(bucket.len() + 1 + key.len());
    bytes.extend_from_slice(bucket.as_bytes());
    bytes.push(0);
    bytes.extend_from_slice(key.as_bytes());
    bytes
}

/// `bucket NUL key NUL version`: a retained version's row key; versions sort in time order.
fn retained_key(object_key: &[u8], version: VersionId) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(object_key.len() + 17);
    bytes.extend_from_slice(object_key);
    bytes.push(0);
    bytes.extend_from_slice(&version_bytes(version));
    bytes
}

/// Whether a row of `OBJECTS` in bucket `bucket_len` bytes long is a retained version (its key
/// part has a NUL: real keys never do).
fn is_retained_row(row: &[u8], bucket_len: usize) -> bool {
    row.get(bucket_len + 1..).is_some_and(|rest| rest.contains(&0))
}

/// `[object_key NUL, object_key 0x01)`: every retained version of one key.
fn retained_bounds(object_key: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let mut start = object_key.to_vec();
    start.push(0);
    let mut end = object_key.to_vec();
    end.push(1);
    (start, end)
}

/// The version in a [`retained_key`] (its last 16 bytes).
fn version_of_retained_key(key: &[u8]) -> VersionId {
    assert!(key.len() >= 17, "retained keys end in NUL and 16 version bytes");
    version_of_bytes(&key[key.len() - 16..])
}

/// A [`REPAIR_DUE`] row: due time, then version, big-endian (byte order is due order).
fn due_key(not_before_ms: u64, version: VersionId) -> [u8; 24] {
    let mut bytes = [0u8; 24];
    bytes[..8].copy_from_slice(&not_before_ms.to_be_bytes());
    bytes[8..].copy_from_slice(&version_bytes(version));
    bytes
}

/// A version as 16 big-endian bytes (so byte order is version order).
fn version_bytes(version: VersionId) -> [u8; 16] {
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&version.unix_ns.to_be_bytes());
    bytes[8..].copy_from_slice(&version.writer.to_be_bytes());
    bytes
}

fn version_of_bytes(bytes: &[u8]) -> VersionId {
    assert_eq!(bytes.len(), 16, "versions are stored as 16 bytes");
    VersionId {
        unix_ns: u64::from_be_bytes(bytes[..8].try_into().expect("8 bytes")),
        writer: u64::from_be_bytes(bytes[8..].try_into().expect("8 bytes")),
    }
}

/// `[bucket NUL, bucket 0x01)`: every key of one bucket (bucket names and keys have no NUL).
fn bucket_bounds(bucket: &str) -> (Vec<u8>, Vec<u8>) {
    let mut start = bucket.as_bytes().to_vec();
    start.push(0);
    let mut end = bucket.as_bytes().to_vec();
    end.push(1);
    (start, end)
}

fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

#[cfg(test)]
mod tests;
