//! A lean HTTP/1.1 client: one persistent connection per simulated client.
//!
//! On a 2-core machine the load generator competes with the broker and PostgreSQL for CPU,
//! so it uses hyper's connection-level API directly (no pool, no redirects, no TLS) and keeps
//! each connection alive for the whole cell. A connection that fails is re-opened on the
//! next request.

use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::{self, SendRequest};
use hyper::header::{CONTENT_TYPE, HOST, HeaderValue};
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// Errors of the load generator's I/O, boxed because they are only counted and reported.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// An answer: status code and the whole body.
pub struct Answer {
    /// HTTP status code.
    pub status: u16,
    /// The response body.
    pub body: Bytes,
}

/// One keep-alive HTTP/1.1 connection to the broker.
pub struct Conn {
    addr: SocketAddr,
    host: HeaderValue,
    sender: Option<SendRequest<Full<Bytes>>>,
}

impl Conn {
    /// A connection to `addr`, opened lazily by the first request.
    pub fn new(addr: SocketAddr) -> Conn {
        Conn {
            addr,
            host: HeaderValue::from_str(&addr.to_string()).expect("socket address is a valid host"),
            sender: None,
        }
    }

    /// Opens the TCP connection now, so that connection set-up is not timed as a request.
    pub async fn open(&mut self) -> Result<(), BoxError> {
        if self.sender.is_none() {
            let stream = TcpStream::connect(self.addr).await?;
            stream.set_nodelay(true)?;
            let (sender, conn) = http1::handshake(TokioIo::new(stream)).await?;
            tokio::spawn(async move {
                // The connection ends when the sender is dropped or the server closes it.
                let _ = conn.await;
            });
            self.sender = Some(sender);
        }
        Ok(())
    }

    /// Sends one request and reads the whole answer. On an I/O error the connection is
    /// dropped and the next request opens a new one.
    pub async fn send(
        &mut self,
        method: Method,
        path: &str,
        body: Option<Bytes>,
    ) -> Result<Answer, BoxError> {
        let result = self.try_send(method, path, body).await;
        if result.is_err() {
            self.sender = None;
        }
        result
    }

    async fn try_send(
        &mut self,
        method: Method,
        path: &str,
        body: Option<Bytes>,
    ) -> Result<Answer, BoxError> {
        self.open().await?;
        let sender = self.sender.as_mut().expect("opened above");
        sender.ready().await?;
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header(HOST, self.host.clone());
        if body.is_some() {
            req = req.header(CONTENT_TYPE, "application/json");
        }
        let req = req.body(Full::new(body.unwrap_or_default()))?;
        let resp = sender.send_request(req).await?;
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await?.to_bytes();
        Ok(Answer { status, body })
    }
}
