//! Of overlapping writes of one key, the one acknowledged last wins (issue 37 item 9), as S3
//! promises and Ceph's s3-tests (`test_atomic_dual_write_*`) check: a PUT B that began before
//! a PUT A (or a DELETE) of the same key, and is acknowledged after it, is what every later
//! read returns. Each scenario is deterministic: B's body comes from a source that hands over
//! its first stripe, then holds the rest back until the test lets it go, so B has taken its
//! version and is sending when the other write runs from start to acknowledgement.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::task::{Context, Poll};
use std::thread::JoinHandle;
use std::time::Duration;

use client::ObjectInfo;
use tokio::io::{AsyncRead, ReadBuf};

use crate::harness::{Cluster, Shape, block_on, payload};

/// How long the test waits for a gated PUT to reach its gate or to finish once let go.
const STEP_TIMEOUT: Duration = Duration::from_secs(30);

/// A PUT body that hands over its first `gate_at` bytes, then reports that it was asked for
/// more and answers nothing until the test lets it go (or gives up: then an error).
struct GatedSource {
    body: Vec<u8>,
    gate_at: usize,
    pos: usize,
    /// Bytes handed over so far, for the test to see.
    handed: Arc<AtomicUsize>,
    /// Told once when the writer asks for bytes past `gate_at`.
    reached: Option<mpsc::Sender<()>>,
    gate: tokio::sync::oneshot::Receiver<()>,
    open: bool,
}

impl AsyncRead for GatedSource {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.pos >= this.gate_at && !this.open {
            if let Some(reached) = this.reached.take() {
                let _ = reached.send(());
            }
            match Pin::new(&mut this.gate).poll(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(())) => this.open = true,
                Poll::Ready(Err(_)) => return Poll::Ready(Err(io::Error::other("the test gave up on this PUT"))),
            }
        }
        let end = if this.open { this.body.len() } else { this.gate_at };
        let count = buf.remaining().min(end - this.pos);
        buf.put_slice(&this.body[this.pos..this.pos + count]);
        this.pos += count;
        this.handed.store(this.pos, Ordering::SeqCst);
        Poll::Ready(Ok(()))
    }
}

/// A PUT running on its own thread with its own client, held at its source's gate.
struct GatedPut {
    handed: Arc<AtomicUsize>,
    reached: mpsc::Receiver<()>,
    release: Option<tokio::sync::oneshot::Sender<()>>,
    done: mpsc::Receiver<Result<ObjectInfo, client::Error>>,
    thread: Option<JoinHandle<()>>,
}

impl GatedPut {
    /// Starts a PUT of `body` to `bucket/key` whose source stops after the first stripe: the
    /// writer asks for the second stripe's bytes only once it holds its version and is sending
    /// the first stripe (the version read overlaps reading the first stripe, not the second).
    fn start(cluster: &Cluster, bucket: &str, key: &str, body: Vec<u8>) -> Self {
        let client = cluster.client();
        let map = client.map();
        let stripe = map.erasure.k * map.chunk_bytes as usize;
        assert!(body.len() > 2 * stripe, "the body must reach past the first stripe");
        let handed = Arc::new(AtomicUsize::new(0));
        let (reached_tx, reached) = mpsc::channel();
        let (release, gate) = tokio::sync::oneshot::channel();
        let (done_tx, done) = mpsc::channel();
        let mut source = GatedSource {
            body,
            gate_at: stripe,
            pos: 0,
            handed: Arc::clone(&handed),
            reached: Some(reached_tx),
            gate,
            open: false,
        };
        let (bucket, key) = (bucket.to_owned(), key.to_owned());
        let thread = std::thread::spawn(move || {
            let result = block_on(client.put(&bucket, &key, &mut source, &Default::default()));
            let _ = done_tx.send(result);
        });
        Self { handed, reached, release: Some(release), done, thread: Some(thread) }
    }

    /// Waits until the writer has read the whole first stripe and asked for more: it has taken
    /// its version and opened its connections.
    fn wait_at_gate(&self, stripe: usize) {
        if self.reached.recv_timeout(STEP_TIMEOUT).is_err() {
            let early = self.done.try_recv();
            panic!("PUT B never asked for its second stripe in {STEP_TIMEOUT:?} (it ended with {early:?})");
        }
        assert_eq!(
            self.handed.load(Ordering::SeqCst),
            stripe,
            "PUT B must have read its first stripe, and no more, before the other write starts"
        );
        assert!(self.done.try_recv().is_err(), "PUT B must still be running while the other write runs");
    }

    /// Lets the rest of the body go and waits for the PUT's answer.
    fn finish(mut self) -> Result<ObjectInfo, client::Error> {
        let _ = self.release.take().expect("released once").send(());
        let result = self.done.recv_timeout(STEP_TIMEOUT).unwrap_or_else(|_| {
            panic!("PUT B did not finish within {STEP_TIMEOUT:?} of its body being let go");
        });
        self.thread.take().expect("joined once").join().expect("PUT B's thread");
        result
    }
}

/// One stripe's worth of bytes of `cluster`'s map.
fn stripe_bytes(cluster: &Cluster) -> usize {
    let map = cluster.client().map();
    map.erasure.k * map.chunk_bytes as usize
}

/// Which write a read found, in words.
fn whose(read: &Result<Vec<u8>, client::Error>, named: &[(&str, &[u8])]) -> String {
    match read {
        Ok(bytes) => match named.iter().find(|(_, body)| *body == bytes.as_slice()) {
            Some((name, _)) => format!("{name}'s bytes"),
            None => format!("{} bytes of no write in the test", bytes.len()),
        },
        Err(client::Error::NotFound { .. }) => "no object".to_owned(),
        Err(e) => format!("an error: {e}"),
    }
}

/// Three GETs of `bucket/key` return B's bytes (`named`'s last entry), and HEAD the version B
/// was acknowledged with (`info_b`); returns the HEAD. `acknowledged` says when B was, in words.
fn assert_b_wins(
    cluster: &Cluster,
    (bucket, key): (&str, &str),
    info_b: &ObjectInfo,
    named: &[(&str, &[u8])],
    acknowledged: &str,
) -> ObjectInfo {
    let body_b = named.last().expect("B is named").1;
    for attempt in 1..=3 {
        let read = block_on(cluster.client().get(bucket, key));
        assert!(
            matches!(&read, Ok(bytes) if bytes.as_slice() == body_b),
            "the PUT acknowledged {acknowledged} (B) must win: GET #{attempt} read {}",
            whose(&read, named)
        );
    }
    let head = block_on(cluster.client().head(bucket, key)).unwrap();
    assert_eq!(head.meta.version, info_b.meta.version, "HEAD must report the version B was acknowledged with");
    head
}

#[test]
fn of_two_overlapping_puts_the_one_acknowledged_last_wins() {
    let cluster = Cluster::start(Shape::default());
    let (bucket, key) = ("dual", "overlapped");
    block_on(cluster.client().make_bucket(bucket)).unwrap();
    let stripe = stripe_bytes(&cluster);
    let body_b = payload(1 << 20, 0xB);
    let body_a = payload(700_000, 0xA);

    // B begins and is held after its first stripe, its version taken.
    let put_b = GatedPut::start(&cluster, bucket, key, body_b.clone());
    put_b.wait_at_gate(stripe);

    // A runs whole, by another writer, while B is still sending.
    let info_a = block_on(cluster.client().put_bytes(bucket, key, &body_a, &Default::default()))
        .unwrap_or_else(|e| panic!("PUT A, overlapping B, must be acknowledged: {e}"));

    // Then B ends: acknowledged after A.
    let info_b = put_b.finish().unwrap_or_else(|e| panic!("PUT B must be acknowledged after A: {e}"));

    let head = assert_b_wins(&cluster, (bucket, key), &info_b, &[("A", &body_a), ("B", &body_b)], "last");
    assert_eq!(head.meta.size, body_b.len() as u64, "HEAD must report B's size");
    assert!(
        info_b.meta.version > info_a.meta.version,
        "B, acknowledged after A, must have the newer version: B {:?}, A {:?}",
        info_b.meta.version,
        info_a.meta.version
    );
}

#[test]
fn a_put_overlapping_a_delete_acknowledged_before_it_wins() {
    let cluster = Cluster::start(Shape::default());
    let (bucket, key) = ("dual", "deleted-meanwhile");
    let client = cluster.client();
    let body_old = payload(300_000, 0xC);
    block_on(async {
        client.make_bucket(bucket).await.unwrap();
        client.put_bytes(bucket, key, &body_old, &Default::default()).await.unwrap()
    });
    let stripe = stripe_bytes(&cluster);
    let body_b = payload(1 << 20, 0xB);

    // B begins over the existing object and is held after its first stripe, its version taken.
    let put_b = GatedPut::start(&cluster, bucket, key, body_b.clone());
    put_b.wait_at_gate(stripe);

    // The DELETE runs whole, by another writer, while B is still sending.
    block_on(cluster.client().delete(bucket, key))
        .unwrap_or_else(|e| panic!("the DELETE, overlapping B, must be acknowledged: {e}"));

    // Then B ends: acknowledged after the DELETE.
    let info_b = put_b.finish().unwrap_or_else(|e| panic!("PUT B must be acknowledged after the DELETE: {e}"));

    let named: [(&str, &[u8]); 2] = [("the replaced object", &body_old), ("B", &body_b)];
    assert_b_wins(&cluster, (bucket, key), &info_b, &named, "after the DELETE");
    let page = block_on(cluster.client().list(bucket, "", "", 100)).unwrap();
    let listed: Vec<(String, u64)> = page.entries.into_iter().map(|e| (e.key, e.size)).collect();
    assert_eq!(listed, [(key.to_owned(), body_b.len() as u64)], "the listing must show B's object");
}
