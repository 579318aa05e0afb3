//! Watched connections: noticing a database that stops answering.
//!
//! PostgreSQL can fail in two ways. When it stops or crashes, its sockets close and every
//! waiting query fails at once. When it hangs or the network to it goes silent (a stopped
//! machine, a partition), nothing closes: the kernel keeps accepting bytes and a query would
//! wait forever, with its HTTP request behind it. To answer promptly with a 503 instead, every
//! pooled connection runs over a [`Watched`] stream that counts the requests it has sent and
//! the answers it has had back. When a request has gone [`SILENCE`] without a byte from the
//! server, a [`Liveness`] probe opens a fresh connection to the server and checks that it
//! answers at all. A slow query on a live server keeps waiting (so long maintenance statements
//! are fine); a server that does not answer the probe is treated as gone: the silent
//! connection fails, and until a probe succeeds again new writes and connections fail at once.
//! Each server the URL names has its own [`Liveness`]: a frozen old primary does not make the
//! new one look down.
//!
//! The stream also reads the SQLSTATE of the errors it carries: a connection refused a write
//! as read-only (25006: its server was demoted, or a proxy sent it to a standby) fails from
//! then on, so that the pool replaces it instead of sending it more work.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio_postgres::NoTls;
use tokio_postgres::config::Host;

use super::tls::{Secured, Tls, negotiate};

/// The configuration to hand tokio-postgres once TLS, if any, is set up below it.
pub(super) fn in_the_clear(pg: &tokio_postgres::Config) -> tokio_postgres::Config {
    let mut pg = pg.clone();
    pg.ssl_mode(tokio_postgres::config::SslMode::Disable);
    pg
}

/// How long a request may wait for the first byte of its answer before the database is
/// probed. Short, because the probe (not this) decides whether to give up.
pub(crate) const SILENCE: Duration = Duration::from_secs(1);

/// How long the liveness probe waits for the server to answer a fresh connection.
pub(crate) const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a probe's verdict is reused by other connections before probing again.
const PROBE_REUSE: Duration = Duration::from_millis(500);

/// How long opening a TCP connection to the database may take.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Where a server may be reached: a TCP host and port, or a Unix socket path.
#[derive(Debug, Clone)]
pub(super) enum Target {
    Tcp(String, u16),
    Unix(std::path::PathBuf),
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Tcp(host, port) => write!(f, "{host}:{port}"),
            Target::Unix(path) => write!(f, "{}", path.display()),
        }
    }
}

/// The places the URL names, in the order libpq would try them.
pub(super) fn targets(pg: &tokio_postgres::Config) -> Vec<Target> {
    let ports = pg.get_ports();
    let port = |i: usize| ports.get(i).or(ports.first()).copied().unwrap_or(5432);
    let addrs = pg.get_hostaddrs();
    let mut out = Vec::new();
    if pg.get_hosts().is_empty() {
        for (i, a) in addrs.iter().enumerate() {
            out.push(Target::Tcp(a.to_string(), port(i)));
        }
    }
    for (i, host) in pg.get_hosts().iter().enumerate() {
        out.push(match (host, addrs.get(i)) {
            (_, Some(a)) => Target::Tcp(a.to_string(), port(i)),
            (Host::Tcp(h), None) => Target::Tcp(h.clone(), port(i)),
            (Host::Unix(dir), None) => Target::Unix(dir.join(format!(".s.PGSQL.{}", port(i)))),
        });
    }
    out
}

/// A byte stream to the server, TCP or Unix.
pub(crate) enum Socket {
    Tcp(tokio::net::TcpStream),
    Unix(tokio::net::UnixStream),
}

impl Target {
    pub(super) async fn open(&self) -> io::Result<Socket> {
        let timed_out = || io::Error::new(io::ErrorKind::TimedOut, "connecting timed out");
        match self {
            Target::Tcp(host, port) => {
                let s = tokio::time::timeout(
                    CONNECT_TIMEOUT,
                    tokio::net::TcpStream::connect((host.as_str(), *port)),
                )
                .await
                .map_err(|_| timed_out())??;
                let _ = s.set_nodelay(true);
                Ok(Socket::Tcp(s))
            }
            Target::Unix(path) => {
                let s =
                    tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::UnixStream::connect(path))
                        .await
                        .map_err(|_| timed_out())??;
                Ok(Socket::Unix(s))
            }
        }
    }

    /// Opens a connection and sets up TLS on it as `mode` asks (never on Unix sockets).
    async fn secured(&self, tls: &Tls) -> io::Result<Secured<Socket>> {
        let socket = self.open().await?;
        match self {
            Target::Tcp(host, _) => negotiate(socket, tls, host).await,
            Target::Unix(_) => Ok(Secured::Plain(socket)),
        }
    }

    /// Whether a server listens here and answers: opens a connection and sends an SSL
    /// request, which the server answers with one byte (`N` or `S`) before any
    /// authentication. A stopped or unreachable server does not answer at all.
    async fn answers(&self) -> bool {
        let probe = async {
            let mut s = self.open().await?;
            // SSLRequest: length 8, code 80877103.
            let request = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];
            let mut answer = [0u8; 1];
            match &mut s {
                Socket::Tcp(s) => {
                    s.write_all(&request).await?;
                    s.read_exact(&mut answer).await?;
                }
                Socket::Unix(s) => {
                    s.write_all(&request).await?;
                    s.read_exact(&mut answer).await?;
                }
            }
            Ok::<bool, io::Error>(matches!(answer[0], b'N' | b'S'))
        };
        matches!(
            tokio::time::timeout(PROBE_TIMEOUT, probe).await,
            Ok(Ok(true))
        )
    }
}

impl AsyncRead for Socket {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Socket::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Socket::Unix(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Socket {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Socket::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Socket::Unix(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Socket::Tcp(s) => Pin::new(s).poll_flush(cx),
            Socket::Unix(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Socket::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Socket::Unix(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

/// What the pool knows about whether the database answers, shared by all its connections.
#[derive(Default)]
pub(crate) struct Liveness {
    /// Set when a probe found the server silent; cleared when one finds it answering.
    down: AtomicBool,
    /// The last probe's time and verdict; the lock makes concurrent probes share one.
    last: tokio::sync::Mutex<Option<(Instant, bool)>>,
    /// A background probe is running (see [`Liveness::back_again`]).
    probing: AtomicBool,
}

impl Liveness {
    pub(super) fn is_down(&self) -> bool {
        self.down.load(Ordering::Relaxed)
    }

    /// Probes `target` (or reuses a verdict younger than [`PROBE_REUSE`]).
    async fn check(&self, target: &Target) -> bool {
        let mut last = self.last.lock().await;
        if let Some((at, verdict)) = *last
            && at.elapsed() < PROBE_REUSE
        {
            return verdict;
        }
        let verdict = target.answers().await;
        *last = Some((Instant::now(), verdict));
        let was_down = self.down.swap(!verdict, Ordering::Relaxed);
        if was_down == verdict {
            if verdict {
                tracing::info!("the database answers again");
            } else {
                tracing::warn!("the database does not answer; failing requests until it does");
            }
        }
        verdict
    }

    /// Opens a connection to `target` with TLS as `tls` asks. The TLS request is answered
    /// before any authentication, so a server silent for [`SILENCE`] is probed, as a request
    /// of a watched stream would be: a silent server fails the connection, a slow one is
    /// waited for.
    pub(super) async fn secured(&self, target: &Target, tls: &Tls) -> io::Result<Secured<Socket>> {
        let negotiation = target.secured(tls);
        tokio::pin!(negotiation);
        loop {
            match tokio::time::timeout(SILENCE, &mut negotiation).await {
                Ok(secured) => return secured,
                Err(_) if !self.check(target).await => {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the database does not answer",
                    ));
                }
                Err(_) => {}
            }
        }
    }

    /// While the database is down: whether a recent probe found it back. Never waits, so
    /// that requests during an outage are refused at once: when the last verdict is stale it
    /// starts a probe in the background and answers no; a later attempt sees the verdict.
    pub(super) fn back_again(self: &Arc<Self>, target: &Target) -> bool {
        if let Ok(last) = self.last.try_lock()
            && let Some((at, verdict)) = *last
            && at.elapsed() < PROBE_REUSE
        {
            return verdict;
        }
        if !self.probing.swap(true, Ordering::AcqRel) {
            let me = self.clone();
            let target = target.clone();
            tokio::spawn(async move {
                me.check(&target).await;
                me.probing.store(false, Ordering::Release);
            });
        }
        false
    }
}

pub(super) fn io_error(e: io::Error) -> BoxFuture<'static, Result<tokio_postgres::Error, ()>> {
    // tokio-postgres builds its errors itself; feeding it a stream that fails yields its own
    // I/O error, which the rest of the server already treats as "database unavailable".
    Box::pin(async move {
        let mut cfg = tokio_postgres::Config::new();
        cfg.user("comb");
        match cfg.connect_raw(Failing(Some(e)), NoTls).await {
            Err(e) => Ok(e),
            Ok(_) => Err(()),
        }
    })
}

/// A stream whose every operation fails with the error it holds.
struct Failing(Option<io::Error>);

impl Failing {
    fn error(&mut self) -> io::Error {
        self.0
            .take()
            .unwrap_or_else(|| io::Error::other("connection failed"))
    }
}

impl AsyncRead for Failing {
    fn poll_read(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        _: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Poll::Ready(Err(self.get_mut().error()))
    }
}

impl AsyncWrite for Failing {
    fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, _: &[u8]) -> Poll<io::Result<usize>> {
        Poll::Ready(Err(self.get_mut().error()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Err(self.get_mut().error()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// Follows the framing of the PostgreSQL protocol in one direction, counting the messages
/// of interest: requests that the server answers with a ReadyForQuery (Sync and Query,
/// plus the startup message), or ReadyForQuery itself.
#[derive(Debug)]
pub(crate) struct Framing {
    /// The first frontend message (startup) has no type byte.
    untyped_first: bool,
    header: [u8; 5],
    have: usize,
    /// Bytes of the current message's body still to skip.
    body_left: usize,
    /// The start of the current ErrorResponse's body (server side only).
    error: Option<Vec<u8>>,
    /// The SQLSTATE of the last complete ErrorResponse not yet taken.
    error_code: Option<[u8; 5]>,
}

impl Framing {
    /// Framing of what the client sends (starts with the untyped startup message).
    pub fn frontend() -> Framing {
        Framing {
            untyped_first: true,
            header: [0; 5],
            have: 0,
            body_left: 0,
            error: None,
            error_code: None,
        }
    }

    /// Framing of what the server sends.
    pub fn backend() -> Framing {
        Framing {
            untyped_first: false,
            ..Framing::frontend()
        }
    }

    /// Feeds bytes; returns how many complete messages had a type in `types` (the untyped
    /// startup message counts as type 0).
    pub fn feed(&mut self, mut bytes: &[u8], types: &[u8]) -> usize {
        let mut counted = 0;
        while !bytes.is_empty() {
            if self.body_left > 0 {
                let n = self.body_left.min(bytes.len());
                if let Some(body) = self.error.as_mut() {
                    let keep = n.min(ERROR_PREFIX - body.len().min(ERROR_PREFIX));
                    body.extend_from_slice(&bytes[..keep]);
                }
                self.body_left -= n;
                bytes = &bytes[n..];
                if self.body_left == 0
                    && let Some(body) = self.error.take()
                {
                    self.error_code = sqlstate(&body);
                }
                continue;
            }
            let header_len = if self.untyped_first { 4 } else { 5 };
            let n = (header_len - self.have).min(bytes.len());
            self.header[self.have..self.have + n].copy_from_slice(&bytes[..n]);
            self.have += n;
            bytes = &bytes[n..];
            if self.have < header_len {
                break;
            }
            let untyped = self.untyped_first;
            let (kind, len) = if self.untyped_first {
                let len = u32::from_be_bytes(self.header[0..4].try_into().expect("4 bytes"));
                (0u8, len)
            } else {
                let len = u32::from_be_bytes(self.header[1..5].try_into().expect("4 bytes"));
                (self.header[0], len)
            };
            // The length counts itself (4 bytes) but not the type byte.
            self.body_left = (len as usize).saturating_sub(4);
            self.have = 0;
            self.untyped_first = false;
            if kind == b'E' && !untyped {
                self.error = Some(Vec::new());
            }
            if types.contains(&kind) {
                counted += 1;
            }
        }
        counted
    }

    /// The SQLSTATE of the last ErrorResponse seen since the last call (server side).
    pub fn take_error_code(&mut self) -> Option<[u8; 5]> {
        self.error_code.take()
    }
}

/// How much of an ErrorResponse is kept to find its SQLSTATE: the code comes after the
/// severity fields, well within this.
const ERROR_PREFIX: usize = 96;

/// The `C` field (SQLSTATE) of an ErrorResponse body: fields of a type byte and a
/// NUL-terminated string.
fn sqlstate(body: &[u8]) -> Option<[u8; 5]> {
    let mut rest = body;
    while let Some((&kind, tail)) = rest.split_first() {
        if kind == 0 {
            return None;
        }
        let end = tail.iter().position(|&b| b == 0)?;
        if kind == b'C' {
            return tail[..end].try_into().ok();
        }
        rest = &tail[end + 1..];
    }
    None
}

const READ_ONLY_CODE: &[u8; 5] = b"25006";

fn demoted() -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionAborted,
        "the server refused a write as read-only: no longer the primary",
    )
}

/// A connection's stream, watched for silence while requests are outstanding.
pub(crate) struct Watched<S> {
    inner: S,
    target: Target,
    liveness: Arc<Liveness>,
    /// The server refused a write as read-only: no longer the primary. The connection
    /// fails from the next read on, once the refusal itself has been delivered.
    demoted: bool,
    sent: Framing,
    received: Framing,
    /// Requests sent whose ReadyForQuery has not come back yet.
    outstanding: i64,
    /// When the server last showed signs of life while requests were outstanding.
    progress: Instant,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    probe: Option<Pin<Box<dyn Future<Output = bool> + Send>>>,
}

impl<S> Watched<S> {
    pub(super) fn new(inner: S, target: Target, liveness: Arc<Liveness>) -> Watched<S> {
        Watched {
            inner,
            target,
            liveness,
            demoted: false,
            sent: Framing::frontend(),
            received: Framing::backend(),
            outstanding: 0,
            progress: Instant::now(),
            timer: None,
            probe: None,
        }
    }

    /// While requests are outstanding: wait out the silence, then probe; `Ready(Err)` when
    /// the probe says the server is gone.
    fn poll_watch(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        loop {
            if let Some(probe) = self.probe.as_mut() {
                let alive = ready!(probe.as_mut().poll(cx));
                self.probe = None;
                if !alive {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the database stopped answering",
                    )));
                }
                // Slow, but there: give it another round.
                self.progress = Instant::now();
            }
            let deadline = tokio::time::Instant::from_std(self.progress + SILENCE);
            let timer = self
                .timer
                .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
            if timer.deadline() != deadline {
                timer.as_mut().reset(deadline);
            }
            ready!(timer.as_mut().poll(cx));
            self.timer = None;
            let liveness = self.liveness.clone();
            let target = self.target.clone();
            self.probe = Some(Box::pin(async move { liveness.check(&target).await }));
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.demoted {
            return Poll::Ready(Err(demoted()));
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let fresh = &buf.filled()[before..];
                if !fresh.is_empty() {
                    this.progress = Instant::now();
                    this.outstanding -= this.received.feed(fresh, b"Z") as i64;
                    this.probe = None;
                    if this.received.take_error_code() == Some(*READ_ONLY_CODE) {
                        tracing::warn!(
                            server = %this.target,
                            "the database refused a write as read-only: it is no longer the \
                             primary; closing the connection"
                        );
                        this.demoted = true;
                    }
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending if this.outstanding > 0 => match this.poll_watch(cx) {
                Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
                _ => Poll::Pending,
            },
            Poll::Pending => {
                this.timer = None;
                this.probe = None;
                Poll::Pending
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.demoted {
            return Poll::Ready(Err(demoted()));
        }
        if this.liveness.is_down() {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the database does not answer",
            )));
        }
        let n = ready!(Pin::new(&mut this.inner).poll_write(cx, buf))?;
        // Type 0 is the startup message, answered by a ReadyForQuery like Sync and Query.
        let requests = this.sent.feed(&buf[..n], &[0, b'S', b'Q']) as i64;
        if requests > 0 {
            let was_idle = this.outstanding <= 0;
            this.outstanding += requests;
            if was_idle {
                this.progress = Instant::now();
                // The connection task may not read again until woken: arm the timer with
                // its waker now, so silence wakes it.
                let _ = this.poll_watch(cx);
            }
        }
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::{DbError, means_unavailable, pool};

    #[test]
    fn unavailability_is_told_from_statement_errors() {
        use tokio_postgres::error::SqlState;
        for code in [
            SqlState::CANNOT_CONNECT_NOW,
            SqlState::ADMIN_SHUTDOWN,
            SqlState::CRASH_SHUTDOWN,
            SqlState::CONNECTION_FAILURE,
            SqlState::TOO_MANY_CONNECTIONS,
            SqlState::READ_ONLY_SQL_TRANSACTION,
        ] {
            assert!(means_unavailable(&code), "{code:?}");
        }
        for code in [
            SqlState::UNIQUE_VIOLATION,
            SqlState::QUERY_CANCELED,
            SqlState::T_R_DEADLOCK_DETECTED,
            SqlState::LOCK_NOT_AVAILABLE,
        ] {
            assert!(!means_unavailable(&code), "{code:?}");
        }
    }

    #[test]
    fn framing_counts_requests_and_answers_across_chunks() {
        // Startup (untyped, length 8), then Query "x" and Sync, split awkwardly.
        let mut out = Vec::new();
        out.extend_from_slice(&[0, 0, 0, 8, 0, 3, 0, 0]);
        out.extend_from_slice(&[b'Q', 0, 0, 0, 6, b'x', 0]);
        out.extend_from_slice(&[b'P', 0, 0, 0, 4]);
        out.extend_from_slice(&[b'S', 0, 0, 0, 4]);
        let mut f = Framing::frontend();
        let mut n = 0;
        for chunk in out.chunks(3) {
            n += f.feed(chunk, &[0, b'S', b'Q']);
        }
        assert_eq!(n, 3);
        // Two ReadyForQuery among other messages.
        let back = [
            b'R', 0, 0, 0, 8, 0, 0, 0, 0, b'Z', 0, 0, 0, 5, b'I', b'C', 0, 0, 0, 5, b'x', b'Z', 0,
            0, 0, 5, b'T',
        ];
        let mut b = Framing::backend();
        let n: usize = back.chunks(2).map(|c| b.feed(c, b"Z")).sum();
        assert_eq!(n, 2);
    }

    #[test]
    fn framing_finds_the_sqlstate_of_an_error_across_chunks() {
        // ErrorResponse: severity, code 25006, message; then ReadyForQuery.
        let mut body = Vec::new();
        for (kind, value) in [
            (b'S', "ERROR"),
            (b'V', "ERROR"),
            (b'C', "25006"),
            (b'M', "cannot execute INSERT in a read-only transaction"),
        ] {
            body.push(kind);
            body.extend_from_slice(value.as_bytes());
            body.push(0);
        }
        body.push(0);
        let mut bytes = vec![b'E'];
        bytes.extend_from_slice(&((body.len() + 4) as u32).to_be_bytes());
        bytes.extend_from_slice(&body);
        bytes.extend_from_slice(&[b'Z', 0, 0, 0, 5, b'E']);
        let mut f = Framing::backend();
        let mut answers = 0;
        let mut codes = Vec::new();
        for chunk in bytes.chunks(7) {
            answers += f.feed(chunk, b"Z");
            codes.extend(f.take_error_code());
        }
        assert_eq!(answers, 1);
        assert_eq!(codes, vec![*b"25006"]);
        // Other codes are read too, and nothing is left to take.
        assert_eq!(sqlstate(b"SFATAL\0C57P01\0Mbye\0\0"), Some(*b"57P01"));
        assert_eq!(sqlstate(b"SERROR\0C250"), None);
        assert_eq!(f.take_error_code(), None);
    }

    #[tokio::test]
    async fn a_silent_server_fails_the_request_and_new_connections_fail_fast() {
        // A listener that accepts but never answers: what a stopped PostgreSQL looks like.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let held = tokio::spawn(async move {
            let mut conns = Vec::new();
            loop {
                let (s, _) = listener.accept().await.unwrap();
                conns.push(s);
            }
        });
        let pool = pool(&format!("postgres://u@127.0.0.1:{port}/db"), 2).unwrap();
        let started = Instant::now();
        let Err(e) = pool.get().await else {
            panic!("a connection to a silent server");
        };
        assert!(matches!(DbError::from(e), DbError::Unavailable(_)));
        let first = started.elapsed();
        assert!(
            first < SILENCE + PROBE_TIMEOUT + Duration::from_secs(1),
            "{first:?}"
        );
        // While it stays silent, further requests fail at once, also once the verdict is
        // stale (a new probe then runs in the background).
        for pause in [0, 700] {
            tokio::time::sleep(Duration::from_millis(pause)).await;
            let started = Instant::now();
            assert!(pool.get().await.is_err());
            assert!(started.elapsed() < Duration::from_millis(200));
        }
        held.abort();
    }
}
