//! The status page (`/ui`) of a three-node cluster over plain HTTP: served with the cluster secret
//! (bearer, or the password of HTTP Basic auth as a browser sends it) and refused without it, with
//! a wrong one or with a backend secret; Basic credentials open nothing else; the document is
//! self-contained (no external fetches), locked down by its headers, and shows every node's arcs
//! of the ring, its members and its events; `/ui/live` is the part the page refreshes.

mod common;

use base64::Engine;
use common::{http, random_hex, Cluster};

fn basic(user: &str, password: &str) -> String {
    format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}")))
}

fn get(c: &Cluster, i: usize, path: &str, auth: Option<&str>) -> http::Response {
    let headers: Vec<(&str, &str)> = auth.iter().map(|a| ("Authorization", *a)).collect();
    http::request(c.nodes[i].cluster_addr(), "GET", path, &headers, None, http::REQUEST_TIMEOUT).unwrap()
}

#[test]
fn the_status_page_is_served_with_the_cluster_secret_only() {
    let (c, _) = Cluster::form(3, &[]);
    let bearer = c.bearer();

    // Refused: no credentials (with a Basic challenge, so a browser asks), wrong ones, a backend secret.
    let r = get(&c, 1, "/ui", None);
    assert_eq!(r.status, 401, "{}", r.text());
    assert!(r.header("www-authenticate").is_some_and(|v| v.starts_with("Basic realm=")), "{:?}", r.headers);
    let wrong = random_hex(32);
    for auth in [
        basic("admin", &wrong),
        basic("admin", ""),
        format!("Bearer {wrong}"),
        format!("Basic {}", "A".repeat(5000)),
        "Basic !!!".to_string(),
        basic(&c.secret, "x"),
    ] {
        assert_eq!(get(&c, 1, "/ui", Some(&auth)).status, 401, "{auth}");
    }
    let backend = std::fs::read_to_string(c.nodes[0].data_dir.join("backend.secret")).unwrap();
    let r = get(&c, 0, "/ui", Some(&format!("Bearer {}", backend.trim())));
    assert_eq!(r.status, 401, "a backend secret does not open the page: {}", r.text());
    assert_eq!(get(&c, 0, "/ui/live", None).status, 401);

    // Basic credentials are for the page's GETs only: not the admin API, not a POST to the page.
    let browser = basic("any-user", &c.secret);
    assert_eq!(get(&c, 0, "/cluster/status", Some(&browser)).status, 401);
    let post = http::request(
        c.nodes[0].cluster_addr(),
        "POST",
        "/cluster/drain",
        &[("Authorization", browser.as_str())],
        None,
        http::REQUEST_TIMEOUT,
    )
    .unwrap();
    assert_eq!(post.status, 401, "a cross-site form with cached Basic credentials drains nothing");
    let post = http::request(
        c.nodes[0].cluster_addr(),
        "POST",
        "/ui",
        &[("Authorization", browser.as_str())],
        None,
        http::REQUEST_TIMEOUT,
    )
    .unwrap();
    assert_eq!(post.status, 405);

    // Served, on every node, to the browser's Basic credentials and to the bearer secret.
    for i in 0..3 {
        for auth in [&browser, &bearer] {
            let r = get(&c, i, "/ui", Some(auth));
            assert_eq!(r.status, 200, "{}", r.text());
            let page = r.text();
            assert!(r.header("content-type").is_some_and(|v| v.starts_with("text/html")));
            assert_eq!(r.header("cache-control"), Some("no-store"));
            assert_eq!(r.header("x-frame-options"), Some("DENY"));
            let csp = r.header("content-security-policy").unwrap_or_default();
            assert!(csp.contains("default-src 'none'") && csp.contains("script-src 'nonce-"), "{csp}");
            let nonce = csp.split("'nonce-").nth(1).and_then(|s| s.split('\'').next()).unwrap();
            assert!(page.contains(&format!("<script nonce=\"{nonce}\">")), "the page's script carries the nonce");
            // Self-contained: nothing to fetch but /ui/live (the SVG namespace is a name, not a fetch).
            assert!(!page.contains(" src=") && !page.contains("url("), "external asset in the page");
            let hrefs: Vec<&str> = page.split("href=\"").skip(1).filter_map(|s| s.split('"').next()).collect();
            assert_eq!(hrefs, ["data:,"], "only the empty icon");
            assert!(page.contains("/ui/live"));
            // The ring: each node's arcs; members; events.
            for n in ["n1", "n2", "n3"] {
                assert!(page.contains(&format!("class=\"arc\" data-node=\"{n}\"")), "{n}'s arcs");
                assert!(
                    page.contains(&format!("<tr class=\"member\" data-node=\"{n}\" data-state=\"live\"")),
                    "{n}'s row"
                );
            }
            assert!(page.contains("3 live") && page.contains("ring v"), "the ring's caption");
            assert!(page.contains("joined as a"), "membership events");
            assert!(page.contains("id=\"cluster-events\""), "the replicated event log's panel");
            assert!(page.contains("data-trigger=\"join\"") && page.contains("added as a voter"), "replicated events");
            assert!(!page.contains(&c.secret), "the page shows no secret");
        }
    }

    // The live part alone, for the page's refresh.
    let r = get(&c, 2, "/ui/live", Some(&browser));
    assert_eq!(r.status, 200);
    let live = r.text();
    assert!(!live.contains("<html") && !live.contains("<script"), "a fragment");
    assert!(live.contains("<svg id=\"ring\"") && live.contains("id=\"members\"") && live.contains("id=\"events\""));
}
