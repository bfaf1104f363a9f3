//! The words the code cites are defined in the repository (docs/): every invariant `I<n>` a comment names
//! has its section in docs/invariants.md, every `decision N` in docs/decisions.md, every `seed NNN` in
//! docs/seeds.md, every `docs/<name>.md` exists; no comment points at a document outside the repository
//! (`design/...`), and no `//` or `//!` comment cites an issue number (a rule or a decision says why,
//! an issue number tells a newcomer nothing). `///` text that becomes the OpenAPI document is left to it.
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn rust_files() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let path = entry.path();
            let name = entry.file_name();
            if name == "node_modules" || name == ".venv" || name == "target" {
                continue;
            }
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    for dir in ["src", "tests/api", "migration/src", "benches"] {
        walk(&Path::new(ROOT).join(dir), &mut out);
    }
    out
}

/// `(file:line, is a /// line, the comment's text)` for every comment in the Rust files.
fn comments() -> Vec<(String, bool, String)> {
    let mut out = Vec::new();
    for path in rust_files() {
        let text = std::fs::read_to_string(&path).unwrap();
        let rel = path.strip_prefix(ROOT).unwrap().display().to_string();
        for (n, line) in text.lines().enumerate() {
            // A `//` inside a string ("http://") is not a comment.
            let Some(at) = comment_start(line) else { continue };
            let comment = &line[at..];
            let doc = comment.starts_with("///") && !comment.starts_with("////");
            out.push((format!("{rel}:{}", n + 1), doc, comment.to_string()));
        }
    }
    out
}

/// Where a line's comment starts, outside string literals (good enough for this code base: strings do
/// not span the `//` of a comment on the same line).
fn comment_start(line: &str) -> Option<usize> {
    let bytes = line.as_bytes();
    let mut in_str = false;
    let mut i = 0;
    while i + 1 < bytes.len() {
        match bytes[i] {
            b'\\' if in_str => i += 1,
            b'"' => in_str = !in_str,
            b'/' if !in_str && bytes[i + 1] == b'/' => return Some(i),
            _ => {}
        }
        i += 1;
    }
    None
}

/// The numbers that follow `word` (case-insensitive, then spaces) in `text`: `issue 42` → 42.
fn numbers_after(text: &str, word: &str) -> Vec<u32> {
    let lower = text.to_ascii_lowercase();
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(i) = lower[from..].find(word) {
        let start = from + i;
        from = start + word.len();
        let before = lower[..start].chars().next_back();
        if before.is_some_and(|c| c.is_ascii_alphanumeric()) {
            continue;
        }
        let rest = lower[from..].trim_start_matches(' ');
        let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
        if let Ok(n) = digits.parse() {
            out.push(n);
        }
    }
    out
}

/// The invariant numbers cited: `I7`, `I15-I20` (both ends), `(I3)`.
fn invariants_cited(text: &str) -> Vec<u32> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    for (i, b) in bytes.iter().enumerate() {
        if *b != b'I' || (i > 0 && (bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_')) {
            continue;
        }
        let digits: String = text[i + 1..].chars().take_while(|c| c.is_ascii_digit()).collect();
        let after = text[i + 1 + digits.len()..].chars().next();
        if !digits.is_empty() && !after.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            out.push(digits.parse().unwrap());
        }
    }
    out
}

fn doc(name: &str) -> String {
    std::fs::read_to_string(Path::new(ROOT).join("docs").join(name)).unwrap_or_else(|e| panic!("docs/{name}: {e}"))
}

/// The numbers of the `## <Word> N — ` headings of a document.
fn headings(text: &str, word: &str) -> BTreeSet<u32> {
    text.lines()
        .filter_map(|l| l.strip_prefix(&format!("## {word}")))
        .filter_map(|rest| {
            let digits: String = rest.trim_start().chars().take_while(|c| c.is_ascii_digit()).collect();
            digits.parse().ok()
        })
        .collect()
}

#[test]
fn every_cited_invariant_decision_seed_and_document_is_defined_here() {
    let invariants = headings(&doc("invariants.md"), "I");
    let decisions = headings(&doc("decisions.md"), "Decision");
    let seeds = headings(&doc("seeds.md"), "Seed");
    assert_eq!(
        invariants,
        (1..=invariants.len() as u32).collect(),
        "docs/invariants.md numbers its rules I1 to In without a gap"
    );
    let mut undefined = Vec::new();
    for (at, _, comment) in comments() {
        for n in invariants_cited(&comment) {
            if !invariants.contains(&n) {
                undefined.push(format!("{at}: I{n} is not in docs/invariants.md"));
            }
        }
        for n in numbers_after(&comment, "decision") {
            if !decisions.contains(&n) {
                undefined.push(format!("{at}: decision {n} is not in docs/decisions.md"));
            }
        }
        for n in numbers_after(&comment, "seed") {
            if !seeds.contains(&n) {
                undefined.push(format!("{at}: seed {n:03} is not in docs/seeds.md"));
            }
        }
        if comment.contains("design/") && comment.contains(".md") {
            undefined.push(format!(
                "{at}: cites a design document outside the repository: {comment}"
            ));
        }
        let mut rest = comment.as_str();
        while let Some(i) = rest.find("docs/") {
            let name: String = rest[i + 5..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_' || *c == '.')
                .collect();
            let name = name.trim_end_matches('.');
            if name.ends_with(".md") && !Path::new(ROOT).join("docs").join(name).is_file() {
                undefined.push(format!("{at}: docs/{name} does not exist"));
            }
            rest = &rest[i + 5..];
        }
    }
    assert!(undefined.is_empty(), "cited but not defined:\n{}", undefined.join("\n"));
}

#[test]
fn no_comment_cites_an_issue_number() {
    let cited: Vec<String> = comments()
        .into_iter()
        .filter(|(_, doc, comment)| !doc && !numbers_after(comment, "issue").is_empty())
        .map(|(at, _, comment)| format!("{at}: {}", comment.trim()))
        .collect();
    assert!(
        cited.is_empty(),
        "comments citing issue numbers (say the rule or decision instead):\n{}",
        cited.join("\n")
    );
}

#[test]
fn the_scanner_sees_what_it_checks() {
    assert_eq!(
        invariants_cited("// I7 and I15-I20 (I3), not ID2 or MI5 or I2x"),
        vec![7, 15, 20, 3]
    );
    assert_eq!(
        numbers_after("Issue 42 item 3; reissue 9; decision 7", "issue"),
        vec![42]
    );
    assert_eq!(comment_start(r#"let u = "http://x"; // I2"#), Some(20));
    assert_eq!(comment_start(r#"let u = "a \" // b";"#), None);
    assert_eq!(
        headings("## I1 — a\n## I2 — b\n### I9 x\n", "I"),
        BTreeSet::from([1, 2])
    );
}
