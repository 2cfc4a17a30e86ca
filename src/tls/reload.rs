//! Certificate reload: every listener's files are re-read on SIGHUP, and a listener's files when
//! one of them changes (polled every [`POLL`]). Each attempt is logged and counted in
//! `gateway_tls_reloads_total{listener, result}`; a failed one keeps the old certificate. The
//! files are read on the blocking pool. Without TLS a SIGHUP is logged and ignored (it does not
//! stop the node, so `systemctl reload` is harmless).

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio_util::sync::CancellationToken;

use super::ServerTls;
use crate::metrics::TlsLabel;

/// How often the files are checked for a change.
pub const POLL: Duration = Duration::from_secs(2);

/// Watches `listeners` (possibly none) until `stop`.
pub async fn run(listeners: Vec<Arc<ServerTls>>, reloads: Family<TlsLabel, Counter>, stop: CancellationToken) {
    let mut hup = match signal(SignalKind::hangup()) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(error = %e, "cannot handle SIGHUP; certificates reload on file changes only");
            None
        }
    };
    let mut tick = tokio::time::interval(POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let forced = tokio::select! {
            _ = stop.cancelled() => return,
            _ = hangup(&mut hup) => true,
            _ = tick.tick() => false,
        };
        if forced && listeners.is_empty() {
            tracing::info!("sighup: no TLS certificates to reload");
        }
        for tls in &listeners {
            let t = tls.clone();
            let attempt = tokio::task::spawn_blocking(move || (forced || t.changed()).then(|| t.reload())).await;
            let Ok(Some(outcome)) = attempt else { continue };
            let why = if forced { "sighup" } else { "file_changed" };
            let (listener, cert) = (tls.listener, tls.cert_file().display());
            let result = match outcome {
                Ok(()) => {
                    tracing::info!(listener, cert = %cert, why, "tls certificate reloaded");
                    "ok"
                }
                Err(e) => {
                    tracing::error!(listener, error = %e, why, "tls reload refused; the previous certificate stays in use");
                    "error"
                }
            };
            reloads.get_or_create(&TlsLabel { listener, result }).inc();
        }
    }
}

async fn hangup(hup: &mut Option<Signal>) {
    match hup {
        Some(s) => {
            if s.recv().await.is_none() {
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending().await,
    }
}
