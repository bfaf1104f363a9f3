//! The shape of the house: no file under `src/` passes 600 lines, every top-level module has a rank and
//! imports only modules ranked below it, the worker reaches the database only through the domain, and no
//! two files of `src/` import each other through any chain.
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const SRC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/src");
const MAX_LINES: usize = 600;

/// Every top-level module of `src/` and its rank: a module may import only modules of a lower rank
/// (ARCHITECTURE.md draws the same order). A new module gets a rank here, or the build fails.
const RANKS: &[(&str, u8)] = &[
    // Leaves: they name nothing of berth's.
    ("clock", 0),
    ("event_type", 0),
    ("healthcheck", 0),
    ("ids", 0),
    ("outage", 0),
    ("scope", 0),
    ("shutdown", 0),
    ("version", 0),
    // What everything below the domain shares: settings, the error type, the rows.
    ("actor", 1),
    ("config", 1),
    ("entity", 1),
    ("error", 1),
    ("agent", 2),
    ("auth", 2),
    ("managed_path", 2),
    ("metrics", 2),
    ("telemetry", 2),
    ("ui", 2),
    ("events", 3),
    ("git", 3),
    ("executor", 4),
    ("store", 4),
    ("runtime", 5),
    // The rules.
    ("domain", 6),
    // What calls the rules: the HTTP handlers and the background workers.
    ("api", 7),
    ("worker", 7),
    ("startup", 8),
    ("graceful", 9),
    ("import", 9),
];

/// Modules that reach the database only through the domain (its transactions, its rules).
const THROUGH_DOMAIN: [&str; 1] = ["worker"];
const STORAGE: [&str; 3] = ["store", "entity", "events"];

fn rank(module: &str) -> Option<u8> {
    RANKS.iter().find(|(m, _)| *m == module).map(|(_, r)| *r)
}

/// A source file and the module path it defines (`src/domain/sessions/launch.rs` → `domain::sessions::launch`).
struct SourceFile {
    path: PathBuf,
    module: Vec<String>,
    text: String,
}

fn source_files() -> Vec<SourceFile> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let mut paths = Vec::new();
    walk(Path::new(SRC), &mut paths);
    paths.sort();
    paths
        .into_iter()
        // Binaries are separate crates: `main.rs` and `bin/` reach the library as `berth::`.
        .filter(|p| {
            let rel = p.strip_prefix(SRC).unwrap();
            rel != Path::new("main.rs") && !rel.starts_with("bin")
        })
        .map(|path| {
            let rel = path.strip_prefix(SRC).unwrap().with_extension("");
            let mut module: Vec<String> = rel.iter().map(|c| c.to_string_lossy().into_owned()).collect();
            if matches!(module.last().map(String::as_str), Some("mod" | "lib")) {
                module.pop();
            }
            let text = std::fs::read_to_string(&path).unwrap();
            SourceFile { path, module, text }
        })
        .collect()
}

/// The text without comments and string literals, so a path in a doc comment or a message is no import.
fn code_only(text: &str) -> String {
    // Unit tests sit at the end of a file, and their `use super::*` names the file itself.
    let text = text.find("#[cfg(test)]\nmod ").map_or(text, |at| &text[..at]);
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '/' if chars.peek() == Some(&'/') => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        out.push('\n');
                        break;
                    }
                }
            }
            '/' if chars.peek() == Some(&'*') => {
                let mut prev = ' ';
                for c in chars.by_ref() {
                    if prev == '*' && c == '/' {
                        break;
                    }
                    prev = c;
                }
            }
            '"' => {
                let mut escaped = false;
                for c in chars.by_ref() {
                    if !escaped && c == '"' {
                        break;
                    }
                    escaped = !escaped && c == '\\';
                }
                out.push_str("\"\"");
            }
            // A char literal ('"' in particular) would open a string above; lifetimes stay.
            '\'' => {
                let rest: String = chars.clone().take(3).collect();
                if rest.starts_with("\\") || rest.chars().nth(1) == Some('\'') {
                    let mut escaped = false;
                    for c in chars.by_ref() {
                        if !escaped && c == '\'' {
                            break;
                        }
                        escaped = !escaped && c == '\\';
                    }
                }
                out.push('\'');
            }
            _ => out.push(c),
        }
    }
    out
}

/// Every path a file names that starts at `crate`, `super` or `self`, with `use` trees expanded.
fn named_paths(code: &str) -> Vec<Vec<String>> {
    fn expand(prefix: &[String], tree: &str, out: &mut Vec<Vec<String>>) {
        let tree = tree.trim();
        if let Some(open) = tree.find('{') {
            let head: Vec<String> = split_path(&tree[..open]);
            let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
            let base: Vec<String> = prefix.iter().cloned().chain(head).collect();
            let mut depth = 0;
            let mut start = 0;
            for (i, c) in inner.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        expand(&base, &inner[start..i], out);
                        start = i + 1;
                    }
                    _ => {}
                }
            }
            expand(&base, &inner[start..], out);
        } else {
            let item = tree.split(" as ").next().unwrap_or("");
            let path: Vec<String> = prefix.iter().cloned().chain(split_path(item)).collect();
            if !path.is_empty() {
                out.push(path);
            }
        }
    }
    fn split_path(s: &str) -> Vec<String> {
        s.split("::")
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(str::to_string)
            .collect()
    }
    let mut out = Vec::new();
    // `use` declarations (possibly multi-line trees).
    let mut rest = code;
    while let Some(at) = find_use(rest) {
        let after = &rest[at..];
        let end = after.find(';').unwrap_or(after.len());
        expand(&[], &after[4..end], &mut out);
        rest = &after[end..];
    }
    // Inline paths such as `crate::domain::tasks::get(..)`.
    let bytes = code.as_bytes();
    for root in ["crate::", "super::", "self::"] {
        let mut from = 0;
        while let Some(i) = code[from..].find(root) {
            let at = from + i;
            from = at + root.len();
            if at > 0 && (bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_' || bytes[at - 1] == b':') {
                continue;
            }
            let end = code[at..]
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                .map_or(code.len(), |e| at + e);
            out.push(split_path(&code[at..end]));
        }
    }
    out.retain(|p| matches!(p.first().map(String::as_str), Some("crate" | "super" | "self")));
    out
}

fn find_use(code: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(i) = code[from..].find("use ") {
        let at = from + i;
        let before = code[..at].chars().next_back();
        if before.is_none_or(|c| c.is_whitespace() || matches!(c, '{' | ';' | ')' | ']')) {
            return Some(at);
        }
        from = at + 4;
    }
    None
}

/// The file a path lands in: the deepest module of it that is a file of `src/`.
fn resolve(from: &[String], path: &[String], modules: &BTreeMap<Vec<String>, usize>) -> Option<usize> {
    let mut abs: Vec<String> = Vec::new();
    let mut parts = path.iter().peekable();
    match parts.peek().map(|s| s.as_str()) {
        Some("crate") => {
            parts.next();
        }
        Some("self") => {
            parts.next();
            abs = from.to_vec();
        }
        Some("super") => {
            abs = from.to_vec();
            while parts.peek().is_some_and(|p| *p == "super") {
                parts.next();
                abs.pop();
            }
        }
        _ => return None,
    }
    let mut best = modules.get(&abs).copied();
    for part in parts {
        abs.push(part.clone());
        match modules.get(&abs) {
            Some(&i) => best = Some(i),
            None => break,
        }
    }
    best
}

fn imports() -> (Vec<SourceFile>, Vec<BTreeSet<usize>>) {
    let files = source_files();
    let modules: BTreeMap<Vec<String>, usize> = files.iter().enumerate().map(|(i, f)| (f.module.clone(), i)).collect();
    let edges = files
        .iter()
        .enumerate()
        .map(|(i, f)| {
            named_paths(&code_only(&f.text))
                .iter()
                .filter_map(|p| resolve(&f.module, p, &modules))
                // A module naming its own children (`pub mod`, re-exports of a child) is its tree, not an import
                // back: only a child importing its ancestor counts.
                .filter(|&j| j != i && !files[j].module.starts_with(&f.module))
                // sea-orm declares a relation at both of its ends (`belongs_to` here, `has_many` there):
                // two entity files naming each other are one relation, not a layering cycle.
                .filter(|&j| !(is_entity(f) && is_entity(&files[j])))
                .collect()
        })
        .collect();
    (files, edges)
}

fn is_entity(f: &SourceFile) -> bool {
    f.module.first().is_some_and(|m| m == "entity")
}

fn rel(f: &SourceFile) -> String {
    f.path.strip_prefix(SRC).unwrap().display().to_string()
}

#[test]
fn no_source_file_passes_600_lines() {
    let long: Vec<String> = source_files()
        .iter()
        .filter(|f| f.text.lines().count() > MAX_LINES)
        .map(|f| format!("src/{} has {} lines", rel(f), f.text.lines().count()))
        .collect();
    assert!(
        long.is_empty(),
        "one concern per file, at most {MAX_LINES} lines:\n{}",
        long.join("\n")
    );
}

/// The agent protocols' wire names and the protocol checks: only the seam (`src/agent/`) names them.
const WIRE_NAMES: [&str; 24] = [
    "\"agent_start\"",
    "\"agent_end\"",
    "\"agent_settled\"",
    "\"message_update\"",
    "\"message_end\"",
    "\"extension_ui_request\"",
    "\"extension_ui_response\"",
    "\"extension_ui_expired\"",
    "\"tool_execution_start\"",
    "\"tool_execution_end\"",
    "\"queue_update\"",
    "\"get_state\"",
    "\"get_commands\"",
    "\"get_available_models\"",
    "assistantMessageEvent",
    "\"jsonrpc\"",
    "\"session/",
    "\"fs/",
    "sessionUpdate",
    "stopReason",
    "AgentProtocol::",
    "Protocol::Pi",
    "Protocol::Acp",
    "Protocol::JsonLines",
];

/// Where protocol names may appear outside the seam: the seam itself, the configuration that names the
/// protocols, the test agent (an agent speaking the JSON-lines protocol), and the OpenAPI examples (a
/// recorded line shown as an agent wrote it).
fn may_name_the_wire(f: &SourceFile) -> bool {
    matches!(f.module.first().map(String::as_str), Some("agent" | "config" | "bin")) || f.module == ["api", "examples"]
}

/// The text without comments and without the unit tests at the end; string literals kept.
fn without_comments(text: &str) -> String {
    let text = text.find("#[cfg(test)]\nmod ").map_or(text, |at| &text[..at]);
    text.lines()
        .map(|l| {
            let t = l.trim_start();
            if t.starts_with("//") { "" } else { l }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// `runtime/` and `domain/` speak the seam's types, never a protocol's wire names, and never ask which
/// protocol they talk to.
#[test]
fn agent_protocols_live_behind_the_seam() {
    let mut found = Vec::new();
    for f in source_files().iter().filter(|f| !may_name_the_wire(f)) {
        let code = without_comments(&f.text);
        for name in WIRE_NAMES {
            if code.contains(name) {
                found.push(format!("src/{} names {name}", rel(f)));
            }
        }
    }
    assert!(
        found.is_empty(),
        "agent protocols are spoken in src/agent/ only:\n{}",
        found.join("\n")
    );
    // The checker sees a wire name.
    let probe = SourceFile {
        path: PathBuf::from(format!("{SRC}/runtime/probe.rs")),
        module: vec!["runtime".into(), "probe".into()],
        text: "fn f(v: &Value) -> bool { v[\"type\"] == \"agent_start\" }".into(),
    };
    assert!(!may_name_the_wire(&probe) && WIRE_NAMES.iter().any(|n| without_comments(&probe.text).contains(n)));
}

#[test]
fn every_module_has_a_rank_and_imports_only_below_it() {
    let (files, edges) = imports();
    let mut wrong = Vec::new();
    let top = |f: &SourceFile| f.module.first().cloned();
    for f in &files {
        if let Some(m) = top(f)
            && rank(&m).is_none()
        {
            wrong.push(format!("src/{} is in `{m}`, which has no rank in RANKS", rel(f)));
        }
    }
    for (i, f) in files.iter().enumerate() {
        let Some(from) = top(f) else { continue };
        for &j in &edges[i] {
            let Some(to) = top(&files[j]) else { continue };
            if to == from {
                continue;
            }
            let (Some(a), Some(b)) = (rank(&from), rank(&to)) else {
                continue;
            };
            if b >= a {
                wrong.push(format!(
                    "src/{} (`{from}`, rank {a}) imports src/{} (`{to}`, rank {b})",
                    rel(f),
                    rel(&files[j])
                ));
            }
            if THROUGH_DOMAIN.contains(&from.as_str()) && STORAGE.contains(&to.as_str()) {
                wrong.push(format!(
                    "src/{} reaches `{to}` itself; it goes through `domain`",
                    rel(f)
                ));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "each module imports only modules of a lower rank:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_rank_table_names_each_module_once() {
    let mut seen = BTreeSet::new();
    for (m, _) in RANKS {
        assert!(seen.insert(*m), "{m} is ranked twice");
    }
}

#[test]
fn no_import_cycle_among_source_files() {
    let (files, edges) = imports();
    // Tarjan's strongly connected components: any component of more than one file is a cycle.
    struct State<'a> {
        edges: &'a [BTreeSet<usize>],
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        on_stack: Vec<bool>,
        stack: Vec<usize>,
        next: usize,
        cycles: Vec<Vec<usize>>,
    }
    fn visit(s: &mut State, v: usize) {
        s.index[v] = Some(s.next);
        s.low[v] = s.next;
        s.next += 1;
        s.stack.push(v);
        s.on_stack[v] = true;
        for &w in s.edges[v].iter() {
            match s.index[w] {
                None => {
                    visit(s, w);
                    s.low[v] = s.low[v].min(s.low[w]);
                }
                Some(iw) if s.on_stack[w] => s.low[v] = s.low[v].min(iw),
                Some(_) => {}
            }
        }
        if Some(s.low[v]) == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack[w] = false;
                component.push(w);
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                s.cycles.push(component);
            }
        }
    }
    let n = files.len();
    let mut s = State {
        edges: &edges,
        index: vec![None; n],
        low: vec![0; n],
        on_stack: vec![false; n],
        stack: Vec::new(),
        next: 0,
        cycles: Vec::new(),
    };
    for v in 0..n {
        if s.index[v].is_none() {
            visit(&mut s, v);
        }
    }
    let report: Vec<String> = s
        .cycles
        .iter()
        .map(|c| {
            let mut names: Vec<String> = c.iter().map(|&i| format!("src/{}", rel(&files[i]))).collect();
            names.sort();
            format!("- {}", names.join(", "))
        })
        .collect();
    assert!(
        report.is_empty(),
        "files that import each other (through any chain):\n{}",
        report.join("\n")
    );
}

#[test]
fn the_checker_sees_imports() {
    // The checks above are only as good as the path reader: it must see use trees, inline paths and
    // `super`, and ignore comments and strings.
    let code = code_only(
        "use crate::a::{b, c::{d, e as f}};\n// crate::hidden::x\nlet s = \"crate::nope\";\nsuper::g::h();\nuse super::{self as me, i};",
    );
    let paths: BTreeSet<String> = named_paths(&code).iter().map(|p| p.join("::")).collect();
    for want in [
        "crate::a::b",
        "crate::a::c::d",
        "crate::a::c::e",
        "super::g::h",
        "super::i",
    ] {
        assert!(paths.contains(want), "{want} not seen in {paths:?}");
    }
    assert!(
        !paths.iter().any(|p| p.contains("hidden") || p.contains("nope")),
        "{paths:?}"
    );
}

/// The calls that change an environment's worktrees (their files, their checkout, berth's refs in their
/// repositories), and the functions that wrap them.
const WORKTREE_WRITES: [&str; 9] = [
    "write_tree_files(",
    "worktree_remove(",
    "worktree_remove_consented(",
    "keep_object(",
    "drop_refs(",
    "Step::Commit",
    "Step::FastForward",
    "remove_inside(",
    "destroy_worktree(",
];

/// Each function of `src/` with its signature and its body (comments and strings removed).
fn functions(code: &str) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(at) = code[from..].find("fn ").map(|i| i + from) {
        from = at + 3;
        let before = code[..at].chars().last();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let name: String = code[at + 3..]
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        // The body opens at the first `{` after the signature's closing parenthesis (or `;`: no body).
        let Some(open) = code[at..].find(['{', ';']).map(|i| i + at) else {
            break;
        };
        if &code[open..=open] == ";" {
            continue;
        }
        let mut depth = 0;
        let mut close = open;
        for (i, c) in code[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        close = open + i;
                        break;
                    }
                }
                _ => {}
            }
        }
        out.push((name, code[at..open].to_string(), code[open..=close].to_string()));
    }
    out
}

/// One writer at a time (`domain::writer`): a function of the domain that changes a worktree takes the
/// environment's `WriterLease`, or takes it itself (`writer::acquire`) before it does. The git layer
/// below is the mechanism; the executor's removal of what a failed materialization had just made is the
/// one writer before the environment exists.
#[test]
fn every_worktree_write_holds_the_writer_lease() {
    let mut unheld = Vec::new();
    let mut seen = 0;
    for f in source_files()
        .iter()
        .filter(|f| f.module.first().is_some_and(|m| m == "domain"))
    {
        for (name, signature, body) in functions(&code_only(&f.text)) {
            let writes: Vec<&str> = WORKTREE_WRITES
                .iter()
                .copied()
                .filter(|w| body.contains(w) && !w.starts_with(&format!("{name}(")))
                .collect();
            if writes.is_empty() {
                continue;
            }
            seen += 1;
            if !signature.contains("WriterLease") && !body.contains("writer::acquire(") {
                unheld.push(format!("src/{}: fn {name} calls {writes:?}", rel(f)));
            }
        }
    }
    assert!(
        seen >= 8,
        "the check finds the domain's worktree writes ({seen} functions)"
    );
    assert!(
        unheld.is_empty(),
        "these change a worktree without the environment's writer lease:\n{}",
        unheld.join("\n")
    );
}

#[test]
fn the_writer_rule_check_sees_a_write_without_a_lease() {
    let code = "fn restore(ctx: &Ctx) { ctx.git.write_tree_files(&m, t, i).await; }\n\
                fn held(ctx: &Ctx, lease: &WriterLease) { ctx.git.write_tree_files(&m, t, i).await; }";
    let fns = functions(code);
    assert_eq!(fns.len(), 2);
    assert!(!fns[0].1.contains("WriterLease") && fns[0].2.contains("write_tree_files("));
    assert!(fns[1].1.contains("WriterLease"));
}
