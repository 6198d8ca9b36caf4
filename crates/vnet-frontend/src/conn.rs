//! The vhost-user control connection (a unix stream socket) from the frontend's side.

use crate::proto::{self, req};
use std::fmt;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::time::{Duration, Instant};
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

/// What can go wrong talking to the backend. Kept apart from other errors so callers (hostile
/// mode, disconnect handling) can tell a closed connection from a silent backend.
#[derive(Debug)]
pub enum ConnError {
    /// The backend closed the connection (EOF or reset).
    Closed,
    /// No (complete) reply within the timeout.
    Timeout,
    /// The backend answered with a non-zero REPLY_ACK status.
    Nack { request: u32, status: u64 },
    /// A reply that does not fit the protocol.
    Protocol(String),
    /// Any other socket error.
    Io(io::Error),
}

impl fmt::Display for ConnError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConnError::Closed => write!(f, "backend closed the connection"),
            ConnError::Timeout => write!(f, "backend did not answer in time"),
            ConnError::Nack { request, status } => write!(
                f,
                "backend rejected {} (REPLY_ACK status {status:#x})",
                req::name(*request)
            ),
            ConnError::Protocol(s) => write!(f, "protocol error: {s}"),
            ConnError::Io(e) => write!(f, "socket error: {e}"),
        }
    }
}

impl std::error::Error for ConnError {}

impl From<io::Error> for ConnError {
    fn from(e: io::Error) -> Self {
        match e.kind() {
            io::ErrorKind::UnexpectedEof
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted => ConnError::Closed,
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => ConnError::Timeout,
            _ => ConnError::Io(e),
        }
    }
}

/// The control connection.
pub struct Conn {
    stream: UnixStream,
    /// REPLY_ACK negotiated: set NEED_REPLY on requests without a reply of their own.
    pub reply_ack: bool,
    /// How long to wait for a reply.
    pub timeout: Duration,
}

/// Connects to a listening backend, retrying while the socket is missing or refuses until
/// `timeout` (a backend that is just starting).
pub fn connect(path: &Path, timeout: Duration) -> Result<UnixStream, ConnError> {
    let deadline = Instant::now() + timeout;
    loop {
        match UnixStream::connect(path) {
            Ok(s) => return Ok(s),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused
                ) && Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(ConnError::Io(io::Error::new(
                    e.kind(),
                    format!("{}: {e}", path.display()),
                )))
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Binds `path` (a stale socket file is removed first) for `--listen`.
pub fn bind(path: &Path) -> io::Result<UnixListener> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    UnixListener::bind(path)
}

/// Waits up to `timeout` for one backend to connect to `listener`.
pub fn accept(listener: &UnixListener, timeout: Duration) -> Result<UnixStream, ConnError> {
    if !poll_readable(listener.as_raw_fd(), timeout)? {
        return Err(ConnError::Timeout);
    }
    let (s, _) = listener.accept()?;
    Ok(s)
}

/// poll(2) for readability (or hang-up) of one fd.
pub fn poll_readable(fd: RawFd, timeout: Duration) -> io::Result<bool> {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    loop {
        // SAFETY: `pfd` is a valid pollfd on our stack and we pass a count of 1.
        let r = unsafe { libc::poll(&mut pfd, 1, ms) };
        if r >= 0 {
            return Ok(r > 0);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

impl Conn {
    pub fn new(stream: UnixStream, timeout: Duration) -> Self {
        Conn {
            stream,
            reply_ack: false,
            timeout,
        }
    }

    pub fn raw_fd(&self) -> RawFd {
        self.stream.as_raw_fd()
    }

    /// Sends one message with an explicit flags word (hostile cases use odd ones).
    pub fn send_message(
        &self,
        request: u32,
        flags: u32,
        payload: &[u8],
        fds: &[RawFd],
    ) -> Result<(), ConnError> {
        let size = u32::try_from(payload.len())
            .map_err(|_| ConnError::Protocol("payload too large".into()))?;
        let mut buf = Vec::with_capacity(proto::HEADER_LEN + payload.len());
        buf.extend_from_slice(&proto::header(request, flags, size));
        buf.extend_from_slice(payload);
        self.send_raw(&buf, fds)
    }

    /// Sends arbitrary bytes (with `fds` attached to the first byte).
    pub fn send_raw(&self, bytes: &[u8], fds: &[RawFd]) -> Result<(), ConnError> {
        if bytes.is_empty() {
            return Ok(());
        }
        let n = if fds.is_empty() {
            (&self.stream).write(bytes)?
        } else {
            self.stream
                .send_with_fds(&[bytes], fds)
                .map_err(|e| ConnError::from(io::Error::from_raw_os_error(e.errno())))?
        };
        if n < bytes.len() {
            (&self.stream).write_all(&bytes[n..])?;
        }
        Ok(())
    }

    /// Half-closes our sending side (the backend sees EOF).
    pub fn shutdown_write(&self) -> io::Result<()> {
        self.stream.shutdown(std::net::Shutdown::Write)
    }

    fn read_exact_timeout(&self, buf: &mut [u8], deadline: Instant) -> Result<(), ConnError> {
        let mut got = 0;
        while got < buf.len() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(ConnError::Timeout);
            }
            self.stream.set_read_timeout(Some(left))?;
            match (&self.stream).read(&mut buf[got..]) {
                Ok(0) => return Err(ConnError::Closed),
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Reads one reply to `request` and returns its payload.
    pub fn recv_reply(&self, request: u32) -> Result<Vec<u8>, ConnError> {
        let deadline = Instant::now() + self.timeout;
        let mut h = [0u8; proto::HEADER_LEN];
        self.read_exact_timeout(&mut h, deadline)?;
        let (code, flags, size) = proto::parse_header(&h);
        if size as usize > proto::MAX_PAYLOAD {
            return Err(ConnError::Protocol(format!("reply size {size} too large")));
        }
        let mut payload = vec![0u8; size as usize];
        self.read_exact_timeout(&mut payload, deadline)?;
        if flags & proto::FLAG_REPLY == 0 {
            return Err(ConnError::Protocol(format!(
                "message {} without the REPLY flag",
                req::name(code)
            )));
        }
        if code != request {
            return Err(ConnError::Protocol(format!(
                "expected a reply to {}, got {}",
                req::name(request),
                req::name(code)
            )));
        }
        Ok(payload)
    }

    /// Sends a request; with REPLY_ACK negotiated (and for requests without their own reply)
    /// sets NEED_REPLY and checks the ack.
    pub fn request(&self, request: u32, payload: &[u8], fds: &[RawFd]) -> Result<(), ConnError> {
        let need = self.reply_ack && !req::has_reply(request);
        let flags = proto::FLAG_VERSION_1 | if need { proto::FLAG_NEED_REPLY } else { 0 };
        self.send_message(request, flags, payload, fds)?;
        if need {
            let status = u64_of(&self.recv_reply(request)?, request)?;
            if status != 0 {
                return Err(ConnError::Nack { request, status });
            }
        }
        Ok(())
    }

    /// A request answered with a u64 (GET_FEATURES, GET_PROTOCOL_FEATURES, GET_QUEUE_NUM).
    pub fn get_u64(&self, request: u32) -> Result<u64, ConnError> {
        self.send_message(request, proto::FLAG_VERSION_1, &[], &[])?;
        u64_of(&self.recv_reply(request)?, request)
    }

    /// GET_VRING_BASE: stops the ring, returns the backend's next avail index.
    pub fn get_vring_base(&self, index: u32) -> Result<u32, ConnError> {
        self.send_message(
            req::GET_VRING_BASE,
            proto::FLAG_VERSION_1,
            &proto::vring_state(index, 0),
            &[],
        )?;
        let p = self.recv_reply(req::GET_VRING_BASE)?;
        if p.len() != 8 {
            return Err(ConnError::Protocol(format!(
                "GET_VRING_BASE reply of {} bytes",
                p.len()
            )));
        }
        Ok(u32::from_le_bytes([p[4], p[5], p[6], p[7]]))
    }

    /// Reads and discards whatever the backend has sent that nobody waited for (e.g. a
    /// reply to a garbage request). Returns the byte count and whether EOF was seen.
    pub fn drain_pending(&self) -> (usize, bool) {
        let mut total = 0;
        let mut b = [0u8; 4096];
        loop {
            // SAFETY: reading into a local buffer of its own length, without blocking.
            let n = unsafe {
                libc::recv(
                    self.stream.as_raw_fd(),
                    b.as_mut_ptr().cast(),
                    b.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            match n {
                0 => return (total, true),
                n if n > 0 => total += n as usize,
                _ => return (total, false),
            }
        }
    }

    /// True if the backend has closed the connection (EOF pending) - does not consume data.
    pub fn peer_closed(&self) -> bool {
        let mut pfd = libc::pollfd {
            fd: self.stream.as_raw_fd(),
            events: libc::POLLIN | libc::POLLRDHUP,
            revents: 0,
        };
        // SAFETY: valid pollfd on the stack, count 1, zero timeout.
        let r = unsafe { libc::poll(&mut pfd, 1, 0) };
        if r <= 0 {
            return false;
        }
        if pfd.revents & (libc::POLLHUP | libc::POLLRDHUP | libc::POLLERR) != 0 {
            return true;
        }
        let mut b = [0u8; 1];
        // SAFETY: `b` is a valid 1-byte buffer; MSG_PEEK leaves the data in the socket.
        let n = unsafe {
            libc::recv(
                self.stream.as_raw_fd(),
                b.as_mut_ptr().cast(),
                1,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        n == 0
    }
}

fn u64_of(p: &[u8], request: u32) -> Result<u64, ConnError> {
    let a: [u8; 8] = p.try_into().map_err(|_| {
        ConnError::Protocol(format!(
            "reply to {} has {} bytes, expected 8",
            req::name(request),
            p.len()
        ))
    })?;
    Ok(u64::from_le_bytes(a))
}
