//! The board at `/ui`: static files from the binary, public like `/docs` (I33 names the public pages),
//! with a strict Content-Security-Policy and no file the page names missing.
use reqwest::Method;

use crate::both_backends;
use crate::helpers::TestApp;

both_backends!(the_board_is_served_without_a_token_and_names_no_missing_file);

/// The `src="/ui/..."` and `href="/ui/..."` references of a page, and the `from './x.js'` imports of a
/// module (each once).
fn references(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for marker in ["src=\"", "href=\"", "from '", "import '"] {
        for piece in text.split(marker).skip(1) {
            let Some(end) = piece.find(['"', '\'']) else { continue };
            let target = &piece[..end];
            let name = target
                .strip_prefix("/ui/")
                .or_else(|| target.strip_prefix("./"))
                .map(str::to_string);
            if let Some(name) = name
                && !out.contains(&name)
            {
                out.push(name);
            }
        }
    }
    out
}

async fn the_board_is_served_without_a_token_and_names_no_missing_file(app: TestApp) {
    let csp = berth::ui::CSP;
    assert!(csp.starts_with("default-src 'self'"), "{csp}");
    assert!(!csp.contains("unsafe-inline") && !csp.contains("unsafe-eval"), "{csp}");
    // I33: `/ui` is public, like `/docs`; the board is a page, not an operation of the spec.
    assert!(berth::api::PUBLIC_PATHS.contains(&"/ui"));
    let spec = app.call(Method::GET, "/openapi.json", None, None).await.ok(200);
    assert!(
        spec["paths"].as_object().unwrap().keys().all(|p| !p.starts_with("/ui")),
        "the board is not in the spec"
    );
    let mut index_text = None;
    for path in ["/ui", "/ui/", "/ui/index.html"] {
        let r = app.call(Method::GET, path, None, None).await;
        assert_eq!(r.status.as_u16(), 200, "GET {path}: {}", r.text);
        assert_eq!(
            r.header("content-type").as_deref(),
            Some("text/html; charset=utf-8"),
            "{path}"
        );
        assert_eq!(r.header("content-security-policy").as_deref(), Some(csp), "{path}");
        assert_eq!(r.header("cache-control").as_deref(), Some("no-cache"), "{path}");
        assert_eq!(r.header("x-content-type-options").as_deref(), Some("nosniff"), "{path}");
        assert!(r.text.contains("<title>berth"), "{path}: {}", r.text);
        // No inline script: every script element loads a file.
        assert!(!r.text.contains("<script>") && !r.text.contains("<script type=\"module\">"));
        assert!(!r.text.contains(" onclick=") && !r.text.contains(" style=\""));
        index_text = Some(r.text);
    }
    // Everything the page names is served, and so is everything those modules import, transitively.
    let mut queue = references(&index_text.unwrap());
    assert!(
        queue.contains(&"app.js".to_string()) && queue.contains(&"style.css".to_string()),
        "{queue:?}"
    );
    let mut seen = vec!["index.html".to_string()];
    while let Some(name) = queue.pop() {
        if seen.contains(&name) {
            continue;
        }
        let r = app.call(Method::GET, &format!("/ui/{name}"), None, None).await;
        assert_eq!(r.status.as_u16(), 200, "GET /ui/{name}: {}", r.text);
        let want = if name.ends_with(".js") {
            "text/javascript; charset=utf-8"
        } else if name.ends_with(".css") {
            "text/css; charset=utf-8"
        } else {
            "text/html; charset=utf-8"
        };
        assert_eq!(r.header("content-type").as_deref(), Some(want), "/ui/{name}");
        assert_eq!(r.header("content-security-policy").as_deref(), Some(csp), "/ui/{name}");
        assert!(!r.text.is_empty(), "/ui/{name} is empty");
        if name.ends_with(".js") {
            // The page keeps nothing in local storage and never pops an alert.
            assert!(!r.text.contains("localStorage"), "/ui/{name} uses localStorage");
            assert!(!r.text.contains("alert("), "/ui/{name} calls alert()");
            queue.extend(references(&r.text));
        }
        seen.push(name);
    }
    assert!(seen.len() >= 5, "{seen:?}");
    // Every embedded file is reachable from the page (nothing dead ships in the binary).
    for (name, _, _) in berth::ui::FILES {
        assert!(
            seen.iter().any(|s| s == name),
            "{name} is embedded but never referenced"
        );
    }
    // A file that is not there is an ordinary problem+json 404, still without a token.
    app.call(Method::GET, "/ui/nope.js", None, None)
        .await
        .problem(404, "not_found");
    app.call(Method::GET, "/ui/..%2Fopenapi.json", None, None)
        .await
        .problem(404, "not_found");
}
