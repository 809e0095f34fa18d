//! Coalescing of small metadata reads per node: concurrent operations of one client that each
//! ask a node about a key or two (every GET asks the n drives of its key's set, and with several
//! pools probes the others) share one `MetaGet` per node instead of sending one each.
//!
//! Each node has a queue. A caller appends its items and, when fewer than [`SENDERS_MAX`]
//! batches are on their way to the node, starts a sender; otherwise its items ride with the next
//! batch, sent as soon as one of the node's batches is answered. No timer: an idle client's
//! request goes out at once, a busy one's waits at most for one answer from the node. Senders are
//! spawned tasks, so a caller that gives up (its future dropped) never strands the items of the
//! others that share its batch.
//!
//! Bounds: a batch carries at most [`BATCH_ITEMS`] items; a caller with more than
//! [`CALLER_ITEMS_MAX`] items for one node, or one that finds [`QUEUED_ITEMS_MAX`] items already
//! waiting, sends its own request as before.

use std::collections::VecDeque;
use std::sync::Mutex;

use proto::{KeyVersions, MetaDetail, MetaKey};
use tokio::sync::oneshot;

use crate::Client;

/// How many metadata requests a client (with all its clones) sent to nodes, and how many items
/// (a key on one drive) they asked about. Concurrent reads share requests, so under load
/// `items / requests` grows above one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MetadataCounts {
    pub requests: u64,
    pub items: u64,
}

/// One item's answer: the versions its drive holds, or why the node could not say.
pub(crate) type ItemAnswer = Result<KeyVersions, String>;

/// Batches on their way to one node at once: one keeps the node's answers flowing while the
/// next batch fills; a second hides one round trip of queueing when the node is quick.
const SENDERS_MAX: usize = 2;
/// Items in one coalesced request: a node answers each with the key's versions and metadata
/// (CRCs included), so this keeps an answer far inside a frame for ordinary object sizes.
const BATCH_ITEMS: usize = 64;
/// A caller with more items than this for one node (a listing's metadata, a batch HEAD) is
/// already a batch: it sends its own request.
pub(crate) const CALLER_ITEMS_MAX: usize = 8;
/// Items waiting for one node at most; past it callers send their own requests.
const QUEUED_ITEMS_MAX: usize = 4 * BATCH_ITEMS;

/// The metadata items waiting for one node, and how many batches are being sent to it.
#[derive(Debug, Default)]
pub(crate) struct MetaQueue {
    state: Mutex<QueueState>,
}

#[derive(Debug, Default)]
struct QueueState {
    senders: usize,
    waiting: VecDeque<Waiter>,
    /// Items in `waiting`.
    items: usize,
}

#[derive(Debug)]
struct Waiter {
    items: Vec<MetaKey>,
    detail: MetaDetail,
    reply: oneshot::Sender<Vec<ItemAnswer>>,
}

impl MetaQueue {
    /// Asks the node for `items` (at most [`CALLER_ITEMS_MAX`]), together with whatever other
    /// callers ask it meanwhile. One answer per item, in order.
    pub(crate) async fn ask(
        &self,
        client: &Client,
        node_idx: usize,
        items: Vec<MetaKey>,
        detail: MetaDetail,
    ) -> Vec<ItemAnswer> {
        assert!(!items.is_empty() && items.len() <= CALLER_ITEMS_MAX, "a small request");
        let count = items.len();
        let (reply, answer) = oneshot::channel();
        // Err: the queue is full, and the caller asks on its own.
        let start_sender = {
            let mut state = self.state.lock().expect("metadata queue lock poisoned");
            if state.items + count > QUEUED_ITEMS_MAX {
                Err(items)
            } else {
                state.items += count;
                state.waiting.push_back(Waiter { items, detail, reply });
                let start = state.senders < SENDERS_MAX;
                if start {
                    state.senders += 1;
                }
                Ok(start)
            }
        };
        match start_sender {
            Err(items) => return client.meta_get_direct(node_idx, &items, detail).await,
            Ok(true) => {
                let client = client.clone();
                tokio::spawn(async move { drain(&client, node_idx).await });
            }
            Ok(false) => {}
        }
        answer
            .await
            .unwrap_or_else(|_| vec![Err("metadata request abandoned (client shutting down)".to_owned()); count])
    }

    /// The next batch: the oldest waiter and every later one asking the same detail, up to
    /// [`BATCH_ITEMS`] items; `None` (and one sender fewer) when nothing waits.
    fn next_batch(&self) -> Option<(MetaDetail, Vec<Waiter>)> {
        let mut state = self.state.lock().expect("metadata queue lock poisoned");
        let Some(detail) = state.waiting.front().map(|w| w.detail) else {
            state.senders -= 1;
            return None;
        };
        let mut batch = Vec::new();
        let mut items = 0;
        let mut kept = VecDeque::with_capacity(state.waiting.len());
        while let Some(waiter) = state.waiting.pop_front() {
            let fits = batch.is_empty() || items + waiter.items.len() <= BATCH_ITEMS;
            if waiter.detail == detail && fits {
                items += waiter.items.len();
                batch.push(waiter);
            } else {
                kept.push_back(waiter);
            }
        }
        state.waiting = kept;
        state.items -= items;
        Some((detail, batch))
    }
}

/// Sends the node's waiting items, batch after batch, until none wait.
async fn drain(client: &Client, node_idx: usize) {
    let queue = &client.topo.meta_queues[node_idx];
    while let Some((detail, batch)) = queue.next_batch() {
        let items: Vec<MetaKey> = batch.iter().flat_map(|w| w.items.iter().cloned()).collect();
        let mut answers = client.meta_get_direct(node_idx, &items, detail).await.into_iter();
        for waiter in batch {
            let mine: Vec<ItemAnswer> = answers.by_ref().take(waiter.items.len()).collect();
            // A caller that gave up dropped its receiver; nothing to do.
            let _ = waiter.reply.send(mine);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(key: usize) -> MetaKey {
        MetaKey { drive: 0, bucket: "b".to_owned(), key: format!("k{key}") }
    }

    /// Queues a waiter of `count` items directly (as `ask` does), returning its receiver.
    fn push(queue: &MetaQueue, first: usize, count: usize, detail: MetaDetail) -> oneshot::Receiver<Vec<ItemAnswer>> {
        let (reply, answer) = oneshot::channel();
        let mut state = queue.state.lock().unwrap();
        state.items += count;
        state.waiting.push_back(Waiter { items: (first..first + count).map(item).collect(), detail, reply });
        answer
    }

    fn keys(batch: &[Waiter]) -> Vec<String> {
        batch.iter().flat_map(|w| w.items.iter().map(|i| i.key.clone())).collect()
    }

    #[test]
    fn a_batch_takes_the_oldest_detail_in_order_and_leaves_the_rest_queued() {
        let queue = MetaQueue::default();
        queue.state.lock().unwrap().senders = 1;
        let _a = push(&queue, 0, 2, MetaDetail::Versions);
        let _b = push(&queue, 2, 1, MetaDetail::WithFloor);
        let _c = push(&queue, 3, 3, MetaDetail::Versions);
        let (detail, batch) = queue.next_batch().unwrap();
        assert_eq!(detail, MetaDetail::Versions);
        assert_eq!(keys(&batch), ["k0", "k1", "k3", "k4", "k5"]);
        let (detail, batch) = queue.next_batch().unwrap();
        assert_eq!(detail, MetaDetail::WithFloor);
        assert_eq!(keys(&batch), ["k2"]);
        assert!(queue.next_batch().is_none());
        let state = queue.state.lock().unwrap();
        assert_eq!((state.senders, state.items), (0, 0), "the sender left and nothing is counted as waiting");
    }

    #[test]
    fn a_batch_stays_within_its_item_bound_and_keeps_callers_whole() {
        let queue = MetaQueue::default();
        queue.state.lock().unwrap().senders = 1;
        let waiters = 2 * BATCH_ITEMS / CALLER_ITEMS_MAX + 1;
        let _answers: Vec<_> =
            (0..waiters).map(|w| push(&queue, w * CALLER_ITEMS_MAX, CALLER_ITEMS_MAX, MetaDetail::Versions)).collect();
        let mut seen = Vec::new();
        while let Some((_, batch)) = queue.next_batch() {
            let items: usize = batch.iter().map(|w| w.items.len()).sum();
            assert!(items <= BATCH_ITEMS, "{items} items in one batch");
            assert!(batch.iter().all(|w| w.items.len() == CALLER_ITEMS_MAX), "a caller's items are never split");
            seen.extend(keys(&batch));
        }
        let expected: Vec<String> = (0..waiters * CALLER_ITEMS_MAX).map(|k| format!("k{k}")).collect();
        assert_eq!(seen, expected, "every item once, oldest first");
    }
}
