//! The lines of a unified diff, numbered as its hunks number them: what a review comment can point at.

/// Which version of a file a line number counts in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// The file as it was (a removed or an unchanged line).
    Old,
    /// The file as it is (an added or an unchanged line).
    New,
}

/// One line shown in a patch's hunks.
#[derive(Debug, PartialEq, Eq)]
pub struct Line {
    /// Its number in the old file, for an unchanged or removed line.
    pub old: Option<u32>,
    /// Its number in the new file, for an unchanged or added line.
    pub new: Option<u32>,
    /// `+`, `-` or ` `.
    pub kind: char,
    /// The line without its marker and newline (bytes that are not UTF-8 are shown replaced).
    pub text: String,
}

/// Every line inside the patch's hunks, in order; headers and `\ No newline` notes are not lines.
pub fn lines(patch: &[u8]) -> Vec<Line> {
    let mut out = Vec::new();
    let (mut old, mut new) = (0u32, 0u32);
    let mut in_hunk = false;
    for raw in patch.split(|b| *b == b'\n') {
        if let Some(header) = raw.strip_prefix(b"@@ ") {
            match hunk_start(header) {
                Some((o, n)) => {
                    (old, new) = (o, n);
                    in_hunk = true;
                }
                None => in_hunk = false,
            }
            continue;
        }
        if !in_hunk {
            continue;
        }
        let Some((&marker, rest)) = raw.split_first() else {
            continue;
        };
        let text = String::from_utf8_lossy(rest.strip_suffix(b"\r").unwrap_or(rest)).into_owned();
        match marker {
            b' ' => {
                out.push(Line {
                    old: Some(old),
                    new: Some(new),
                    kind: ' ',
                    text,
                });
                old += 1;
                new += 1;
            }
            b'-' => {
                out.push(Line {
                    old: Some(old),
                    new: None,
                    kind: '-',
                    text,
                });
                old += 1;
            }
            b'+' => {
                out.push(Line {
                    old: None,
                    new: Some(new),
                    kind: '+',
                    text,
                });
                new += 1;
            }
            b'\\' => {}
            // The next file's header (`diff --git`): the hunk is over.
            _ => in_hunk = false,
        }
    }
    out
}

/// The line a patch shows at `number` on `side`, if it shows one.
pub fn find(lines: &[Line], side: Side, number: u32) -> Option<&Line> {
    lines.iter().find(|l| match side {
        Side::Old => l.old == Some(number),
        Side::New => l.new == Some(number),
    })
}

/// `-a,b +c,d @@ …` → (a, c).
fn hunk_start(header: &[u8]) -> Option<(u32, u32)> {
    let header = std::str::from_utf8(header).ok()?;
    let mut parts = header.split(' ');
    let old = parts.next()?.strip_prefix('-')?;
    let new = parts.next()?.strip_prefix('+')?;
    let first = |range: &str| range.split(',').next()?.parse::<u32>().ok();
    Some((first(old)?, first(new)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PATCH: &[u8] = b"diff --git a/f b/f\nindex 1..2 100644\n--- a/f\n+++ b/f\n@@ -1,3 +1,4 @@\n one\n-two\n+TWO\n+2.5\n three\n@@ -10,2 +11,2 @@ fn x\n ten\n-eleven\n+ELEVEN\n\\ No newline at end of file\n";

    #[test]
    fn hunk_lines_are_numbered_on_both_sides() {
        let l = lines(PATCH);
        assert_eq!(l.len(), 8);
        assert_eq!(find(&l, Side::New, 2).unwrap().text, "TWO");
        assert_eq!(find(&l, Side::New, 3).unwrap().text, "2.5");
        assert_eq!(find(&l, Side::Old, 2).unwrap().text, "two");
        assert_eq!(find(&l, Side::New, 4).unwrap().text, "three");
        assert_eq!(find(&l, Side::Old, 3).unwrap().text, "three");
        assert_eq!(find(&l, Side::New, 12).unwrap().text, "ELEVEN");
        assert_eq!(find(&l, Side::Old, 11).unwrap().text, "eleven");
        // A line the hunks do not show, on either side.
        assert!(find(&l, Side::New, 7).is_none());
        assert!(find(&l, Side::Old, 4).is_none());
    }

    #[test]
    fn a_new_file_has_only_new_lines_and_headers_are_not_lines() {
        let p = b"diff --git a/n b/n\nnew file mode 100644\n--- /dev/null\n+++ b/n\n@@ -0,0 +1,2 @@\n+a\n+b\n";
        let l = lines(p);
        assert_eq!(l.len(), 2);
        assert!(find(&l, Side::Old, 0).is_none());
        assert_eq!(find(&l, Side::New, 1).unwrap().text, "a");
        assert!(lines(b"Binary files a/x and b/x differ\n").is_empty());
    }
}
