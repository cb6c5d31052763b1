//! A minimal HTTP/1.1 client for the agent's listener, Prometheus and Alertmanager.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A minimal HTTP/1.1 GET against 127.0.0.1:`port` (5 s timeout). Returns the status
/// code and the body (de-chunked).
pub async fn http_get(port: u16, path: &str) -> Result<(u16, String), String> {
    http_get_accepting(port, path, "text/plain").await
}

/// [`http_get`] with another `Accept` header (Alertmanager's v2 API wants JSON).
#[allow(dead_code)]
pub async fn http_get_accepting(
    port: u16,
    path: &str,
    accept: &str,
) -> Result<(u16, String), String> {
    let exchange = async {
        let mut s = TcpStream::connect(("127.0.0.1", port))
            .await
            .map_err(|e| format!("connect 127.0.0.1:{port}: {e}"))?;
        let req = format!(
            "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAccept: {accept}\r\nConnection: close\r\n\r\n"
        );
        s.write_all(req.as_bytes())
            .await
            .map_err(|e| format!("write request: {e}"))?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf)
            .await
            .map_err(|e| format!("read response: {e}"))?;
        Ok::<_, String>(buf)
    };
    let buf = tokio::time::timeout(Duration::from_secs(5), exchange)
        .await
        .map_err(|_| format!("GET {path} timed out after 5s"))??;
    let split = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| format!("no end of headers in {} bytes", buf.len()))?;
    let head = String::from_utf8_lossy(&buf[..split]).to_string();
    let body = &buf[split + 4..];
    let mut lines = head.lines();
    let status_line = lines.next().unwrap_or_default();
    let code: u16 = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("bad status line {status_line:?}"))?;
    let chunked = lines.any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    let body = if chunked {
        dechunk(body)?
    } else {
        body.to_vec()
    };
    Ok((code, String::from_utf8_lossy(&body).to_string()))
}

fn dechunk(mut b: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    loop {
        let eol = b
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or("truncated chunk size line")?;
        let size_txt = String::from_utf8_lossy(&b[..eol]).to_string();
        let size = usize::from_str_radix(size_txt.split(';').next().unwrap_or("").trim(), 16)
            .map_err(|e| format!("bad chunk size {size_txt:?}: {e}"))?;
        b = &b[eol + 2..];
        if size == 0 {
            return Ok(out);
        }
        if b.len() < size {
            return Err("truncated chunk".into());
        }
        out.extend_from_slice(&b[..size]);
        b = b.get(size + 2..).unwrap_or(&[]);
    }
}

// ---------------------------------------------------------------------------------
// Raw connections, for the listener's limits (tests/http.rs, tests/server_limits.rs)
// ---------------------------------------------------------------------------------

/// A scrape's request line and headers, without the blank line that ends them.
pub const HALF_A_SCRAPE: &[u8] = b"GET /metrics HTTP/1.1\r\nHost: inboxwatch\r\n";
/// A whole keep-alive scrape.
pub const A_SCRAPE: &[u8] = b"GET /metrics HTTP/1.1\r\nHost: inboxwatch\r\n\r\n";

/// A TCP connection to 127.0.0.1:`port`; panics if it cannot be made.
pub async fn connect(port: u16) -> TcpStream {
    TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap_or_else(|e| panic!("connect to 127.0.0.1:{port}: {e}"))
}

/// A connection whose request's headers never end.
pub async fn half_sent(port: u16) -> TcpStream {
    let mut stream = connect(port).await;
    stream
        .write_all(HALF_A_SCRAPE)
        .await
        .expect("write half a request");
    stream
}

/// Reads and discards until the server closes the connection (EOF or reset);
/// returns when, or `None` if it is still open after `deadline`.
pub async fn closed_within(stream: &mut TcpStream, deadline: Duration) -> Option<Instant> {
    let closed = async {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return Instant::now(),
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(deadline, closed).await.ok()
}

/// Reads one response with a `Content-Length` body; returns its status line.
pub async fn read_response(stream: &mut TcpStream) -> String {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        let n = stream.read(&mut byte).await.expect("read a response head");
        assert_eq!(n, 1, "the server closed the connection mid-response");
        buf.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&buf).to_string();
    let length: usize = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse().ok())?
        })
        .unwrap_or_else(|| panic!("no Content-Length in {head:?}"));
    let mut body = vec![0u8; length];
    stream
        .read_exact(&mut body)
        .await
        .expect("read a response body");
    head.lines().next().unwrap_or_default().to_string()
}

/// A complete keep-alive GET of `/metrics`, from a client that does not close.
pub async fn scrape_on(stream: &mut TcpStream) -> String {
    stream.write_all(A_SCRAPE).await.expect("write a scrape");
    read_response(stream).await
}
