//! The lease calls: grant, one keep-alive at a time (through any member or a chosen one),
//! revoke.

use crate::{codec, pb, Client, Error, Meta};
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
        self.call_at(i, timeout, &|ch| {
            keepalive_once(ch, self.request((), Meta::Token), id)
        })
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
        self.authed(&(), timeout, |ch, r| keepalive_once(ch, r, id))
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
/// the stream goes when the answer is read.
async fn keepalive_once(ch: Channel, r: tonic::Request<()>, id: i64) -> Result<i64, Status> {
    let requests =
        tokio_stream::iter([pb::LeaseKeepAliveRequest { id }]).chain(tokio_stream::pending());
    let (meta, ext, ()) = r.into_parts();
    let r = tonic::Request::from_parts(meta, ext, requests);
    let mut answers = pb::lease_client::LeaseClient::new(ch)
        .lease_keep_alive(r)
        .await?
        .into_inner();
    match answers.message().await? {
        Some(a) => Ok(a.ttl),
        None => Err(Status::unavailable(
            "keep-alive stream closed without an answer",
        )),
    }
}
