//! The key-value calls: ranges (whole, counted, or paged as one snapshot, linearizable or
//! as etcd's gRPC proxy can answer from its cache), puts, deletes and transactions with
//! comparisons.

use crate::{codec, pb, prefix_end, Client, Compare, CompareTarget, Error, RangeResponse, TxnOp};
use crate::{MAX_ANSWER_LEN, PAGE_TIMEOUT, PAGE_TIMEOUT_STEPS};
use std::time::Duration;
use tracing::debug;

impl Client {
    /// A range read waiting at most `timeout`.
    fn range_within(
        &self,
        request: &pb::RangeRequest,
        timeout: Duration,
    ) -> Result<RangeResponse, Error> {
        let answer = self.authed(request, timeout, |ch, r| async move {
            let a = pb::kv_client::KvClient::new(ch)
                .max_decoding_message_size(MAX_ANSWER_LEN as usize)
                .range(r)
                .await?;
            Ok(a.into_inner())
        })?;
        Ok(codec::range_response(answer))
    }

    /// The keys from `key` up to `range_end` (exclusive), or `key` alone.
    pub fn range(&self, key: &[u8], range_end: Option<&[u8]>) -> Result<RangeResponse, Error> {
        self.range_within(
            &codec::range_request(key, range_end, 0, 0, false),
            self.call_timeout(),
        )
    }

    pub fn get_prefix(&self, prefix: &[u8]) -> Result<RangeResponse, Error> {
        self.range(prefix, Some(&prefix_end(prefix)))
    }

    /// How many keys there are from `key` up to `range_end` (the answer's `count`, at its
    /// `revision`): linearizable, and cheap (etcd counts in its index, reads no value, sends
    /// no key).
    pub fn count(&self, key: &[u8], range_end: Option<&[u8]>) -> Result<RangeResponse, Error> {
        self.range_within(&codec::count_request(key, range_end), self.call_timeout())
    }

    /// Every key starting with `prefix`, as one snapshot read in pages of at most `page` keys
    /// (each page at the first page's revision, continuing after the last key read).
    ///
    /// Why: a large overlay is megabytes; in one answer, under load, that is what exceeds a
    /// timeout and makes an agent read it all again. A page is small enough to finish, etcd
    /// serves other calls between pages, and a page that times out (after at least
    /// [`PAGE_TIMEOUT`]) is asked again with twice the timeout (up to [`PAGE_TIMEOUT_STEPS`]
    /// times) instead of starting over. A snapshot revision compacted away meanwhile is an
    /// error (read again from the start). Pages cost etcd too (3.4 walks its index over the
    /// rest of the range for each), so they should not be small.
    pub fn get_prefix_paged(&self, prefix: &[u8], page: i64) -> Result<RangeResponse, Error> {
        let mut all = RangeResponse::default();
        self.read_pages(
            prefix.to_vec(),
            Some(&prefix_end(prefix)),
            page,
            false,
            None,
            &mut all,
        )?;
        Ok(all)
    }

    /// The keys of every range of `ranges` (from, up to; in order), as one snapshot read in
    /// pages of at most `page` keys, serializable: what etcd's gRPC proxy can answer from its
    /// cache, so that the agents behind one proxy starting together cost etcd one read.
    ///
    /// The proxy (etcd 3.4) caches a serializable range under the whole request, and keeps
    /// one read at a given revision until its cache is full (such an answer never changes);
    /// one at the current revision (0) only until a write through that proxy touches its
    /// range. So the first page is asked at revision 0, which every agent asks alike, and its
    /// answer's revision pins every other page and range, which the agents then also ask
    /// alike. A cached first page may be older than what the caller must see (writes through
    /// another proxy, or to etcd, do not clear it): when its revision is below `floor` it is
    /// asked again linearizable, which etcd answers and the proxy caches in its place. Without
    /// a proxy a serializable read is etcd's own data, without the leader's confirmation.
    pub fn snapshot_paged(
        &self,
        ranges: &[(Vec<u8>, Option<Vec<u8>>)],
        page: i64,
        floor: i64,
    ) -> Result<RangeResponse, Error> {
        let mut all = RangeResponse::default();
        let Some(((key, end), rest)) = ranges.split_first() else {
            return Ok(all);
        };
        let end = end.as_deref();
        let mut first = self.page(&codec::range_request(key, end, page, 0, true))?;
        if first.revision < floor {
            debug!(
                revision = first.revision,
                floor, "etcd: a cached snapshot older than asked for; reading a current one"
            );
            all.bytes += first.bytes;
            first = self.page(&codec::range_request(key, end, page, 0, false))?;
        }
        self.read_pages(key.clone(), end, page, true, Some(first), &mut all)?;
        for (key, end) in rest {
            self.read_pages(key.clone(), end.as_deref(), page, true, None, &mut all)?;
        }
        Ok(all)
    }

    /// Appends to `all` the keys from `from` up to `end` in pages of at most `page` keys, each
    /// read at `all.revision` (0: the current one, which the first page then fixes for the
    /// rest); `first` is the first page when it was read already. The range's count is added
    /// to `all.count`.
    fn read_pages(
        &self,
        mut from: Vec<u8>,
        end: Option<&[u8]>,
        page: i64,
        serializable: bool,
        mut first: Option<RangeResponse>,
        all: &mut RangeResponse,
    ) -> Result<(), Error> {
        let mut first_page = true;
        loop {
            let r = match first.take() {
                Some(r) => r,
                None => self.page(&codec::range_request(
                    &from,
                    end,
                    page,
                    all.revision,
                    serializable,
                ))?,
            };
            if all.revision == 0 {
                all.revision = r.revision;
            }
            if first_page {
                all.count += r.count;
                first_page = false;
            }
            all.bytes += r.bytes;
            let Some(last) = r.kvs.last() else {
                return Ok(());
            };
            // The next page starts just after the last key (keys are ordered bytewise).
            from = last.key.clone();
            from.push(0);
            let more = r.more && page > 0;
            all.kvs.extend(r.kvs);
            if !more {
                return Ok(());
            }
        }
    }

    /// One page: a range that times out is asked again with twice the timeout, up to
    /// [`PAGE_TIMEOUT_STEPS`] times; the first wait is at least [`PAGE_TIMEOUT`].
    fn page(&self, request: &pb::RangeRequest) -> Result<RangeResponse, Error> {
        let mut timeout = self.call_timeout().max(PAGE_TIMEOUT);
        let mut attempt = 1;
        loop {
            match self.range_within(request, timeout) {
                Err(e) if e.is_unreachable() && attempt < PAGE_TIMEOUT_STEPS => {
                    debug!(attempt, ?timeout, "etcd: range page failed: {e}");
                    timeout *= 2;
                    attempt += 1;
                }
                Err(e) if request.serializable && e.is_future_revision() => {
                    // A member behind the snapshot's revision (the pages of one snapshot may
                    // reach different members): asked linearizable, it first catches up.
                    debug!(
                        revision = request.revision,
                        "etcd: {e}; asking linearizable"
                    );
                    let linearizable = pb::RangeRequest {
                        serializable: false,
                        ..request.clone()
                    };
                    return self.page(&linearizable);
                }
                r => return r,
            }
        }
    }

    /// Puts `value` at `key`, attached to `lease` (0: none). Returns the new revision.
    pub fn put(&self, key: &[u8], value: &[u8], lease: i64) -> Result<i64, Error> {
        let request = codec::put_request(key, value, lease);
        let answer = self.authed(&request, self.call_timeout(), |ch, r| async move {
            Ok(pb::kv_client::KvClient::new(ch).put(r).await?.into_inner())
        })?;
        Ok(answer.header.map_or(0, |h| h.revision))
    }

    /// Deletes `key` (or the range up to `range_end`). Returns the new revision.
    pub fn delete(&self, key: &[u8], range_end: Option<&[u8]>) -> Result<i64, Error> {
        let request = codec::delete_request(key, range_end);
        let answer = self.authed(&request, self.call_timeout(), |ch, r| async move {
            Ok(pb::kv_client::KvClient::new(ch)
                .delete_range(r)
                .await?
                .into_inner())
        })?;
        Ok(answer.header.map_or(0, |h| h.revision))
    }

    /// Runs `success` if every comparison holds, else `failure`, atomically. Returns whether
    /// the comparisons held.
    pub fn txn(
        &self,
        compare: &[Compare],
        success: &[TxnOp],
        failure: &[TxnOp],
    ) -> Result<bool, Error> {
        let request = codec::txn_request(compare, success, failure);
        let answer = self.authed(&request, self.call_timeout(), |ch, r| async move {
            Ok(pb::kv_client::KvClient::new(ch).txn(r).await?.into_inner())
        })?;
        Ok(answer.succeeded)
    }

    /// Puts `value` at `key` (under `lease`, 0 for none) only if the key's `target` holds;
    /// returns whether it did.
    pub fn put_if(
        &self,
        key: &[u8],
        target: CompareTarget,
        value: &[u8],
        lease: i64,
    ) -> Result<bool, Error> {
        let compare = Compare {
            key: key.to_vec(),
            target,
        };
        let put = TxnOp::Put {
            key: key.to_vec(),
            value: value.to_vec(),
            lease,
        };
        self.txn(&[compare], &[put], &[])
    }

    /// Deletes `key` only if its `target` holds; returns whether it did.
    pub fn delete_if(&self, key: &[u8], target: CompareTarget) -> Result<bool, Error> {
        let compare = Compare {
            key: key.to_vec(),
            target,
        };
        let delete = TxnOp::Delete {
            key: key.to_vec(),
            range_end: None,
        };
        self.txn(&[compare], &[delete], &[])
    }
}
