//! `gateway probe URL`: one GET over HTTP (or https with a CA), for health checks where the image
//! has no shell and no HTTP client (the scratch image). A 2xx answer is healthy; anything else —
//! another status, no connection, no whole answer within the deadline — is not; a URL it cannot
//! fetch (not `http://`, or `https://` without a CA) is a usage error.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::{Request, Uri};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// Why a probe failed.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// Not a URL `gateway probe` can fetch (a usage error).
    #[error("{0}")]
    BadUrl(String),
    #[error("{url}: {reason}")]
    Unreachable { url: String, reason: String },
    #[error("{url}: no whole answer within {timeout:?}")]
    Timeout { url: String, timeout: Duration },
    #[error("{url}: answered {status}")]
    Unhealthy { url: String, status: u16 },
}

/// Parses `url`: `http://host[:port][/path]`, or `https://` when `tls` says whom to trust (a
/// probe runs beside the server it checks).
pub fn parse(url: &str, tls: bool) -> Result<Uri, ProbeError> {
    let uri: Uri = url.parse().map_err(|e| ProbeError::BadUrl(format!("{url:?} is not a URL: {e}")))?;
    let scheme_ok = match uri.scheme_str() {
        Some("http") => true,
        Some("https") => tls,
        _ => false,
    };
    if !scheme_ok || uri.host().is_none_or(str::is_empty) {
        return Err(ProbeError::BadUrl(format!("{url:?}: expected http://host:port/path (https:// needs --ca-file)")));
    }
    Ok(uri)
}

/// GETs `url` within `timeout`, over TLS with `tls` for an https URL; Ok with the status when it is 2xx.
pub async fn probe(url: &str, timeout: Duration, tls: Option<Arc<rustls::ClientConfig>>) -> Result<u16, ProbeError> {
    let uri = parse(url, tls.is_some())?;
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(timeout));
    connector.enforce_http(false);
    let config = match tls {
        Some(c) => (*c).clone(),
        // `parse` refused https: this configuration is never used for a handshake.
        None => rustls::ClientConfig::builder_with_provider(crate::tls::provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| ProbeError::BadUrl(e.to_string()))?
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth(),
    };
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(config)
        .https_or_http()
        .enable_http1()
        .wrap_connector(connector);
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build(connector);
    let req = Request::get(uri)
        .header(hyper::header::USER_AGENT, "gateway-probe")
        .body(Empty::new())
        .map_err(|e| ProbeError::BadUrl(e.to_string()))?;
    let unreachable = |reason: String| ProbeError::Unreachable { url: url.to_string(), reason };
    let exchange = async {
        let resp = client.request(req).await.map_err(|e| unreachable(format!("{e:#}")))?;
        let status = resp.status().as_u16();
        // Read the whole answer: a server that stalls mid-body is not healthy.
        resp.into_body().collect().await.map_err(|e| unreachable(e.to_string()))?;
        Ok(status)
    };
    let status = tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| ProbeError::Timeout { url: url.to_string(), timeout })??;
    if (200..300).contains(&status) {
        Ok(status)
    } else {
        Err(ProbeError::Unhealthy { url: url.to_string(), status })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_urls_with_a_host_and_https_only_with_a_ca() {
        assert!(parse("http://127.0.0.1:7070/readyz", false).is_ok());
        assert!(parse("http://gw-1/healthz", false).is_ok());
        assert!(parse("https://gw-1:7070/healthz", true).is_ok());
        for bad in ["https://127.0.0.1:7070/readyz", "127.0.0.1:7070/readyz", "/readyz", "ftp://x/", "http:///x", ""] {
            assert!(matches!(parse(bad, false), Err(ProbeError::BadUrl(_))), "{bad}");
        }
    }
}
