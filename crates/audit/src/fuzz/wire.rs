//! A raw HTTP/1.1 client: one request per connection, written byte for byte, so that bodies
//! may be invalid UTF-8, truncated, chunked or far beyond the limit, and an early answer to an
//! oversized body is still read.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A request body as sent on the wire.
#[derive(Debug, Clone)]
pub enum Body {
    None,
    /// Sent with `Content-Length`.
    Sized(Vec<u8>),
    /// Sent with `Transfer-Encoding: chunked`, in 64 KiB chunks.
    Chunked(Vec<u8>),
}

/// One request to send.
#[derive(Debug, Clone)]
pub struct Case {
    /// What the case is, for reports.
    pub name: String,
    pub method: String,
    /// Path and query, already percent-encoded where needed.
    pub target: String,
    pub body: Body,
    /// The status the case must get, when it is certain.
    pub expect: Option<u16>,
}

/// An HTTP answer.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    /// Header names in lower case.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Answer {
    /// The value of header `name` (lower case), if the answer has it.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// How long one request may take before it counts as hanging.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(20);

/// Sends one request over a fresh connection and reads the whole answer.
pub async fn send(addr: SocketAddr, case: &Case) -> std::io::Result<Answer> {
    tokio::time::timeout(REQUEST_TIMEOUT, exchange(addr, case))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer"))?
}

async fn exchange(addr: SocketAddr, case: &Case) -> std::io::Result<Answer> {
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    let mut head = format!(
        "{} {} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n",
        case.method, case.target
    );
    match &case.body {
        Body::None => {}
        Body::Sized(b) => head.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            b.len()
        )),
        Body::Chunked(_) => {
            head.push_str("Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n")
        }
    }
    head.push_str("\r\n");
    // The server may answer (413) and close before the body is all sent: a failed write is
    // fine as long as the answer can be read.
    let written = async {
        s.write_all(head.as_bytes()).await?;
        match &case.body {
            Body::None => {}
            Body::Sized(b) => s.write_all(b).await?,
            Body::Chunked(b) => {
                for chunk in b.chunks(64 * 1024) {
                    s.write_all(format!("{:x}\r\n", chunk.len()).as_bytes())
                        .await?;
                    s.write_all(chunk).await?;
                    s.write_all(b"\r\n").await?;
                }
                s.write_all(b"0\r\n\r\n").await?;
            }
        }
        Ok::<(), std::io::Error>(())
    }
    .await;
    let mut raw = Vec::new();
    let read = s.read_to_end(&mut raw).await;
    if raw.is_empty() {
        written?;
        read?;
    }
    parse_answer(&raw)
}

fn parse_answer(raw: &[u8]) -> std::io::Result<Answer> {
    let bad = |m: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, m.to_string());
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| bad("no end of head"))?;
    let head = String::from_utf8_lossy(&raw[..end]);
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("no status"))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let mut body = raw[end + 4..].to_vec();
    if headers
        .iter()
        .any(|(n, v)| n == "transfer-encoding" && v.contains("chunked"))
    {
        body = dechunk(&body);
    }
    Ok(Answer {
        status,
        headers,
        body,
    })
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = b.windows(2).position(|w| w == b"\r\n") {
        let size = usize::from_str_radix(String::from_utf8_lossy(&b[..eol]).trim(), 16);
        let Ok(size) = size else { break };
        if size == 0 || b.len() < eol + 2 + size {
            break;
        }
        out.extend_from_slice(&b[eol + 2..eol + 2 + size]);
        b = &b[(eol + 4 + size).min(b.len())..];
    }
    out
}

/// Percent-encodes everything but unreserved characters, so any bytes fit in a path.
pub fn encode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_parse_with_and_without_chunking() {
        let a = parse_answer(b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\n[]").unwrap();
        assert_eq!((a.status, a.body.as_slice()), (201, &b"[]"[..]));
        let a = parse_answer(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\n{}\r\n1\r\n \r\n0\r\n\r\n",
        )
        .unwrap();
        assert_eq!(a.body, b"{} ");
    }

    #[test]
    fn encoding_keeps_only_unreserved_bytes() {
        assert_eq!(encode("a b/é'"), "a%20b%2F%C3%A9%27");
        assert_eq!(encode("A-z_0.~"), "A-z_0.~");
    }
}
