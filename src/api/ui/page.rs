//! The status page's HTML: a self-contained document (inline style and script, no external
//! assets) around the live part — summary, ring, members, events — which the script fetches again
//! every [`REFRESH_MS`] from `/ui/live` and swaps in.

use std::fmt::Write;

use super::events::UiEvent;
use super::ring_svg::{self, Segment, PALETTE};
use crate::wire::StatusReport;

/// How often the page refreshes its live part.
pub const REFRESH_MS: u64 = 2_000;

/// Escapes text for HTML element content and quoted attributes.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// What the live part shows.
pub struct Live<'a> {
    pub report: &'a StatusReport,
    /// The ring's arcs: owner name and `(start, end]` as 64-bit hashes.
    pub arcs: Vec<(&'a str, u64, u64)>,
    pub events: &'a [UiEvent],
    /// The replicated cluster event log, newest first.
    pub cluster_events: &'a [crate::wire::EventView],
}

/// A member's colour: its position among every member sorted by name.
fn colour(report: &StatusReport, name: &str) -> &'static str {
    let mut names: Vec<&str> = report.members.iter().map(|m| m.name.as_str()).collect();
    names.sort_unstable();
    let i = names.iter().position(|n| *n == name).unwrap_or(names.len());
    PALETTE[i % PALETTE.len()]
}

/// The live part (the `<main>` element's content).
pub fn live(l: &Live<'_>) -> String {
    let r = l.report;
    let mut s = String::new();
    let leader = r.leader.as_ref().map_or("none known".to_string(), |x| esc(&x.name));
    let conns: u64 = r.members.iter().map(|m| m.connections).sum();
    let _ = write!(
        s,
        "<p class=\"summary\">cluster <b>{}</b> · answered by <b>{}</b> ({}) · leader <b id=\"leader\">{leader}</b> · \
         term {} · commit {} · applied {} · {} connections · {} routes</p>",
        esc(r.cluster_id.as_deref().unwrap_or("-")),
        esc(&r.node.name),
        esc(&r.server_state),
        r.term,
        r.commit_index,
        r.applied_index,
        conns,
        r.total_routes(),
    );
    let fraction = |h: u64| h as f64 / 2f64.powi(64);
    let segments: Vec<Segment<'_>> = l
        .arcs
        .iter()
        .map(|&(node, start, end)| Segment {
            node,
            colour: colour(r, node),
            start: fraction(start),
            end: fraction(end),
        })
        .collect();
    s.push_str("<div class=\"grid\"><figure>");
    s.push_str(&ring_svg::render(&segments, r.ring.version, r.ring.live.len()));
    s.push_str("<figcaption>");
    for (name, share) in &r.ring.share {
        let _ = write!(
            s,
            "<span class=\"key\"><i style=\"background:{}\"></i>{} {:.1}%</span>",
            colour(r, name),
            esc(name),
            share * 100.0
        );
    }
    s.push_str("</figcaption></figure>");
    s.push_str(
        "<table id=\"members\"><thead><tr><th>node</th><th>id</th><th>role</th><th>state</th><th>lease left</th>\
         <th>connections</th><th>routes</th><th>share</th><th>cluster address</th><th>devices at</th></tr></thead><tbody>",
    );
    for m in &r.members {
        let lease = m.lease_remaining_ms.map_or("-".to_string(), |ms| format!("{:.1} s", ms as f64 / 1000.0));
        let share = r.ring.share.get(&m.name).map_or("-".to_string(), |f| format!("{:.1}%", f * 100.0));
        let lead = if r.leader.as_ref().is_some_and(|x| x.id == m.id) { " ★" } else { "" };
        let _ = write!(
            s,
            "<tr class=\"member\" data-node=\"{name}\" data-state=\"{state}\"><td><i style=\"background:{c}\"></i>{name}{lead}</td>\
             <td>{id}</td><td>{role}</td><td><span class=\"state {state}\">{state}</span></td><td>{lease}</td>\
             <td>{conns}</td><td>{routes}</td><td>{share}</td><td>{addr}</td><td>{url}</td></tr>",
            name = esc(&m.name),
            c = colour(r, &m.name),
            id = m.id,
            role = esc(&m.role),
            state = esc(&m.state),
            conns = m.connections,
            routes = m.routes,
            addr = esc(&m.cluster_addr),
            url = esc(&m.public_url),
        );
    }
    s.push_str(
        "</tbody></table></div><h2>Cluster events <small>(the replicated log: the same on every node, newest \
         first)</small></h2><ol id=\"cluster-events\">",
    );
    for e in l.cluster_events {
        let _ = write!(
            s,
            "<li data-trigger=\"{trigger}\"><time data-ms=\"{at}\">{clock}</time> <b>{trigger}</b> {detail} \
             <small>(connections {c}, routes {r}; live [{before}] → [{after}]; ring v{ring})</small></li>",
            trigger = esc(&e.trigger),
            at = e.at_ms,
            clock = clock(e.at_ms),
            detail = esc(&e.detail),
            c = e.connections,
            r = e.routes,
            before = esc(&e.live_before.join(", ")),
            after = esc(&e.live_after.join(", ")),
            ring = e.ring_version,
        );
    }
    s.push_str(
        "</ol><h2>Seen by this node <small>(in memory, with leader changes; newest first)</small></h2><ol \
         id=\"events\">",
    );
    for e in l.events {
        let _ = write!(s, "<li><time data-ms=\"{}\">{}</time> {}</li>", e.at_ms, clock(e.at_ms), esc(&e.text));
    }
    s.push_str("</ol>");
    s
}

/// `HH:MM:SS` UTC of a Unix time in milliseconds; `--:--:--` for 0 (the bootstrap's membership
/// entry applies before any leader stamped a time).
fn clock(at_ms: u64) -> String {
    if at_ms == 0 {
        return "--:--:--".into();
    }
    let secs = at_ms / 1000;
    format!("{:02}:{:02}:{:02}Z", secs / 3600 % 24, secs / 60 % 60, secs % 60)
}

const STYLE: &str = "body{font:14px/1.4 system-ui,sans-serif;margin:1.2em 2em;color:#222;background:#fafafa}\
h1{font-size:20px;margin:0 0 .3em}h2{font-size:16px;margin:1.2em 0 .4em}h2 small{color:#777;font-weight:400}\
#updated{color:#777;margin-left:1em}#updated.stale{color:#c00;font-weight:600}\
.grid{display:flex;gap:2em;align-items:flex-start;flex-wrap:wrap}figure{margin:0}\
figcaption{text-align:center}.key{margin:0 .5em;white-space:nowrap}\
i{display:inline-block;width:.8em;height:.8em;border-radius:2px;margin-right:.35em;vertical-align:-.05em}\
table{border-collapse:collapse;background:#fff}th,td{padding:.3em .7em;border-bottom:1px solid #e4e4e4;text-align:left}\
th{font-weight:600;background:#f0f0f0}.state{padding:.05em .5em;border-radius:1em;font-size:12px}\
.live{background:#d8f5e1}.suspect{background:#ffe9b3}.draining{background:#dde8ff}.expired{background:#f8d0d0}\
.joining{background:#eee}ol{padding-left:1.2em;color:#333}time{color:#777;font-family:monospace}";

/// The whole document; `nonce` lets the inline script past the Content-Security-Policy.
pub fn document(l: &Live<'_>, nonce: &str) -> String {
    let title = esc(l.report.cluster_id.as_deref().unwrap_or("gateway"));
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>gateway · {title}</title>\
         <meta name=\"viewport\" content=\"width=device-width\"><link rel=\"icon\" href=\"data:,\">\
         <style>{STYLE}</style></head><body><h1>gateway cluster<span id=\"updated\">live, every {secs} s</span></h1>\
         <main id=\"live\">{live}</main><script nonce=\"{nonce}\">{script}</script></body></html>",
        secs = REFRESH_MS / 1000,
        live = live(l),
        script = script(),
    )
}

/// Fetches the live part again and swaps it in; marks the page stale when that fails. The URL is
/// built from `location.origin`: a page opened as `http://user:secret@host/ui` may not fetch a
/// relative URL (it would carry the credentials), while the origin's cached ones still apply.
fn script() -> String {
    format!(
        "(function(){{var m=document.getElementById('live'),u=document.getElementById('updated');\
         function tick(){{fetch(location.origin+'/ui/live',{{cache:'no-store',credentials:'same-origin'}})\
         .then(function(r){{if(!r.ok)throw new Error('HTTP '+r.status);return r.text();}})\
         .then(function(t){{m.innerHTML=t;u.className='';u.textContent='updated '+new Date().toLocaleTimeString();}})\
         .catch(function(e){{u.className='stale';u.textContent='stale: '+e.message;}});}}\
         setInterval(tick,{REFRESH_MS});}})();"
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn times_are_utc_and_an_unstamped_event_has_none() {
        assert_eq!(super::clock(3_723_000), "01:02:03Z");
        assert_eq!(super::clock(86_400_000 + 59_000), "00:00:59Z");
        assert_eq!(super::clock(0), "--:--:--");
    }
}
