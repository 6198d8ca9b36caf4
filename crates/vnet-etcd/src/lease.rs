//! The lease calls: grant, one keep-alive at a time (through any member or a chosen one),
//! revoke.

use crate::held::{Held, ReleaseOnDrop};
use crate::{codec, pb, Client, Error, Meta};
use std::sync::PoisonError;
use std::time::Duration;
use tokio_stream::StreamExt as _;
use tonic::transport::Channel;
use tonic::Status;

impl Client {
    /// Renews a lease once through endpoint `i` only, waiting at most `timeout`: a member that
    /// does not answer in time is reported unreachable rather than skipped. The agent sends
    /// its keep-alives to the member that serves its watch, so the keep-alive doubles as a
    /// probe of that member (a frozen or partitioned member fails it; a watch alone would
    /// just stay silent).
    pub fn lease_keepalive_via(&self, id: i64, i: usize, timeout: Duration) -> Result<i64, Error> {
        let answered = self.call_at(i, timeout, &|ch| {
            keepalive_once(ch, self.request((), Meta::Token), id)
        })?;
        Ok(self.keep_open(answered))
    }

    /// Keeps the stream of an answered keep-alive open, and ends the one kept before: through
    /// etcd's gRPC proxy, a keep-alive stream that stays open has the proxy renew the lease
    /// itself every TTL/3 (as for a Go client's one long-lived stream) until a TTL after its
    /// last answer, or for as long as a request of it waits for one; so a host whose keep-alive
    /// thread runs late on a loaded machine keeps its lease; with one-shot streams the
    /// renewals were only ever the thread's. At most two streams per client: the kept one and
    /// the one in flight. Straight to etcd an open stream renews nothing by itself.
    fn keep_open(&self, (ttl, held): (i64, Held)) -> i64 {
        let before = self
            .kept_alive
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .replace(held);
        if let Some(h) = before {
            h.release();
        }
        ttl
    }

    /// Grants a lease of `ttl_secs`; returns its id and granted TTL.
    pub fn lease_grant(&self, ttl_secs: i64) -> Result<(i64, i64), Error> {
        let request = pb::LeaseGrantRequest {
            ttl: ttl_secs,
            id: 0,
        };
        let answer = self.authed(&request, self.call_timeout(), |ch, r| async move {
            Ok(pb::lease_client::LeaseClient::new(ch)
                .lease_grant(r)
                .await?
                .into_inner())
        })?;
        Ok(codec::lease_grant(&answer)?)
    }

    /// Renews a lease once; returns its remaining TTL, 0 or less when it has expired.
    pub fn lease_keepalive(&self, id: i64) -> Result<i64, Error> {
        self.lease_keepalive_within(id, self.call_timeout())
    }

    /// [`Client::lease_keepalive`] waiting up to `timeout` for the answer.
    pub fn lease_keepalive_within(&self, id: i64, timeout: Duration) -> Result<i64, Error> {
        let answered = self.authed(&(), timeout, |ch, r| keepalive_once(ch, r, id))?;
        Ok(self.keep_open(answered))
    }

    /// Revokes a lease: the keys attached to it are deleted at once.
    pub fn lease_revoke(&self, id: i64) -> Result<(), Error> {
        let request = pb::LeaseRevokeRequest { id };
        self.authed(&request, self.call_timeout(), |ch, r| async move {
            pb::lease_client::LeaseClient::new(ch)
                .lease_revoke(r)
                .await?;
            Ok(())
        })
    }
}

/// One lease keep-alive on a stream of its own: the request side stays open until the answer
/// is in (etcd's gRPC proxy drops a stream its client has closed before answering it), and
/// after it, until the caller releases the returned [`Held`] (see [`Client::keep_open`]); a
/// call that fails or is given up at its deadline ends its stream at once. (One-shot streams,
/// ended once answered, left the renewals to the caller alone: at 1,000 agents through 4
/// proxies, 0-14 leases lost per bring-up. Keeping the last stream open until the next one is
/// open, answered or not, did no better in 4 runs: 1 lease lost in a waves run, 4, 0 and 2 in
/// cold starts.)
async fn keepalive_once(
    ch: Channel,
    r: tonic::Request<()>,
    id: i64,
) -> Result<(i64, Held), Status> {
    let held = ReleaseOnDrop::new();
    let requests = tokio_stream::iter([pb::LeaseKeepAliveRequest { id }]).chain(held.stream());
    let (meta, ext, ()) = r.into_parts();
    let r = tonic::Request::from_parts(meta, ext, requests);
    let mut answers = pb::lease_client::LeaseClient::new(ch)
        .lease_keep_alive(r)
        .await?
        .into_inner();
    match answers.message().await? {
        Some(a) => Ok((a.ttl, held.keep())),
        None => Err(Status::unavailable(
            "keep-alive stream closed without an answer",
        )),
    }
}
