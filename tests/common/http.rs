//! A minimal HTTP/1.1 client for the agent's listener, Prometheus and Alertmanager.

use std::time::Duration;

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
