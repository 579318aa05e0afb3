//! Resource limits at the edge: a cap on open connections, so that a flood of clients meets a
//! clear 503 instead of growing the server's memory without bound.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::serve::Listener;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// A TCP listener that holds at most `max` connections open. A connection beyond the cap is
/// answered `503` with `Retry-After` and closed, without reading its request.
pub(crate) struct LimitedListener {
    inner: TcpListener,
    permits: Arc<Semaphore>,
}

impl LimitedListener {
    /// Wraps `inner`, admitting at most `max` connections at once.
    pub(crate) fn new(inner: TcpListener, max: usize) -> LimitedListener {
        LimitedListener {
            inner,
            permits: Arc::new(Semaphore::new(max)),
        }
    }
}

/// An admitted connection; its slot is freed when it closes.
pub(crate) struct Admitted {
    stream: TcpStream,
    _permit: OwnedSemaphorePermit,
}

const BUSY_BODY: &str = r#"{"type":"urn:comb:problem:connections_exhausted","title":"Service Unavailable","status":503,"detail":"the server holds its maximum number of connections; retry shortly","code":"connections_exhausted","error":"the server holds its maximum number of connections; retry shortly"}"#;

impl Listener for LimitedListener {
    type Io = Admitted;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Admitted, SocketAddr) {
        loop {
            let (stream, addr) = match self.inner.accept().await {
                Ok(c) => c,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            match self.permits.clone().try_acquire_owned() {
                Ok(permit) => {
                    return (
                        Admitted {
                            stream,
                            _permit: permit,
                        },
                        addr,
                    );
                }
                Err(_) => {
                    tokio::spawn(refuse(stream));
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }
}

async fn refuse(mut stream: TcpStream) {
    let head = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/problem+json\r\nretry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n",
        BUSY_BODY.len()
    );
    let _ = tokio::time::timeout(std::time::Duration::from_secs(2), async {
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(BUSY_BODY.as_bytes()).await?;
        stream.shutdown().await
    })
    .await;
}

impl tokio::io::AsyncRead for Admitted {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().stream).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for Admitted {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<io::Result<usize>> {
        std::pin::Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> std::task::Poll<io::Result<usize>> {
        std::pin::Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}
