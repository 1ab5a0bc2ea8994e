//! `docs/results/` holds what `docs/benchmarks.md` is made from, and nothing else: the CSVs of
//! the current tables (gzip-compressed), the plots drawn from them, `meta.txt`, `notes.md` and a
//! `README.md`. Raw
//! logs, profiles and diffs of runs stay out of the tree (git history and the GPU machine's
//! output keep them), so that a clone stays small. `docs/results/README.md` says how.

use std::path::Path;

/// The most `docs/results/` may hold, in bytes. One full run of the benches (one row per timed
/// kernel, 10.6 MB of CSV, 0.63 MB compressed) and its four plots take about 0.95 MB; this
/// leaves room for more scenarios, not for raw logs.
const LIMIT: u64 = 4 << 20;

/// The ends of the names of the files that belong there.
const KINDS: [&str; 5] = [".csv.gz", ".csv", ".png", ".md", ".txt"];

/// `(total bytes, problems)` for a results directory.
fn survey(dir: &Path) -> (u64, Vec<String>) {
    let mut total = 0;
    let mut problems = Vec::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) => return (0, vec![format!("{}: {e}", dir.display())]),
    };
    for entry in entries {
        let entry = match entry {
            Ok(entry) => entry,
            Err(e) => {
                problems.push(format!("{}: {e}", dir.display()));
                continue;
            }
        };
        let path = entry.path();
        let name = path.display();
        match entry.metadata() {
            Ok(meta) if meta.is_dir() => problems.push(format!(
                "{name}: a directory; keep raw runs out of the tree (docs/results/README.md)"
            )),
            Ok(meta) => {
                total += meta.len();
                let file = path.file_name().and_then(|x| x.to_str()).unwrap_or("");
                if !KINDS.iter().any(|kind| file.ends_with(kind)) {
                    problems.push(format!(
                        "{name}: only {KINDS:?} files belong in docs/results (logs, diffs and archives stay in git history)"
                    ));
                }
            }
            Err(e) => problems.push(format!("{name}: {e}")),
        }
    }
    if total > LIMIT {
        problems.push(format!(
            "{} holds {total} bytes, over the limit of {LIMIT}: commit summaries, not raw runs",
            dir.display()
        ));
    }
    (total, problems)
}

#[test]
fn docs_results_stays_small() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/results");
    let (total, problems) = survey(&dir);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    // The tables of docs/benchmarks.md are made from these files: they must be there.
    assert!(total > 0, "{} is empty", dir.display());
}

#[test]
fn the_survey_sees_what_does_not_belong() {
    let dir = std::env::temp_dir().join(format!("toga-repo-size-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("2026-01-01")).unwrap();
    std::fs::write(dir.join("a.csv"), "x\n").unwrap();
    std::fs::write(dir.join("b.csv.gz"), "x\n").unwrap();
    std::fs::write(dir.join("run.log"), "x\n").unwrap();
    std::fs::write(dir.join("logs.tar.gz"), "x\n").unwrap();
    let (total, problems) = survey(&dir);
    assert_eq!(total, 8);
    assert_eq!(problems.len(), 3, "{problems:?}");
    assert!(problems.iter().any(|p| p.contains("a directory")));
    assert!(problems.iter().any(|p| p.contains("run.log")));
    assert!(problems.iter().any(|p| p.contains("logs.tar.gz")));
    std::fs::remove_dir_all(&dir).unwrap();
    let (_, problems) = survey(&dir);
    assert_eq!(
        problems.len(),
        1,
        "a missing directory is a problem: {problems:?}"
    );
}
