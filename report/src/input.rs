//! Reading the benchmark CSVs: every `*.csv` of the results directory, row by row, keeping the
//! rows that parse and naming the ones that do not.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

/// The columns every CSV has, in this order; a last `rounds` column is optional.
pub const COLUMNS: [&str; 10] = [
    "scenario",
    "allocator",
    "size",
    "threads",
    "state",
    "metric",
    "iteration",
    "ms",
    "failed",
    "device",
];
/// The optional column after [`COLUMNS`]: operations per thread in the timed kernel.
pub const ROUNDS: &str = "rounds";

/// One usable CSV row (the `iteration` and `device` columns are checked, not kept).
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub scenario: String,
    pub allocator: String,
    /// A size in bytes (`16`), a range (`16-4096`) or a labelled range (`mixed 16-4096`).
    pub size: String,
    pub threads: u64,
    /// Operations per thread; 1 where the file has no `rounds` column.
    pub rounds: u64,
    /// `fresh`, `warm`, or a heap size such as `8MiB`.
    pub state: String,
    pub metric: String,
    /// Kernel time in milliseconds (for a `utilization` metric: the utilization, 0 to 1).
    pub ms: f64,
    pub failed: u64,
}

/// A row left out of the report, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Rejection {
    pub file: PathBuf,
    /// 1-based line of the file where the row starts.
    pub line: u64,
    pub reason: String,
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}: rejected: {}",
            self.file.display(),
            self.line,
            self.reason
        )
    }
}

/// Everything read from a results directory.
#[derive(Debug, Default)]
pub struct Data {
    /// The usable rows by scenario (the `scenario` column), in file and line order.
    pub samples: BTreeMap<String, Vec<Sample>>,
    /// The rejected rows, in file and line order.
    pub rejected: Vec<Rejection>,
    /// CSV files read.
    pub files: usize,
    /// Data rows read (usable and rejected; the headers not counted).
    pub rows: usize,
}

/// Read every `*.csv` in `dir` (by name order). Errors (one line each): `dir` cannot be listed,
/// it holds no CSV, a file cannot be read, a header is not [`COLUMNS`] with an optional
/// [`ROUNDS`].
pub fn read_dir(dir: &Path) -> Result<Data, String> {
    let entries = std::fs::read_dir(dir)
        .map_err(|e| format!("{}: cannot read the results directory: {e}", dir.display()))?;
    let mut files = Vec::new();
    for entry in entries {
        let path = entry
            .map_err(|e| format!("{}: cannot read the results directory: {e}", dir.display()))?
            .path();
        if path.extension().is_some_and(|x| x == "csv") && path.is_file() {
            files.push(path);
        }
    }
    if files.is_empty() {
        return Err(format!("{}: no CSV files there", dir.display()));
    }
    files.sort();
    let mut data = Data::default();
    for path in files {
        let file = std::fs::File::open(&path)
            .map_err(|e| format!("{}: cannot read: {e}", path.display()))?;
        read_csv(&path, file, &mut data)?;
        data.files += 1;
    }
    Ok(data)
}

/// Read one CSV from `source` (named `path` in messages) into `data`.
pub fn read_csv(path: &Path, source: impl std::io::Read, data: &mut Data) -> Result<(), String> {
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(true)
        .flexible(true)
        .trim(csv::Trim::All)
        .from_reader(source);
    let header = reader
        .headers()
        .map_err(|e| format!("{}: cannot read the header: {e}", path.display()))?
        .clone();
    let with_rounds = check_header(&header).map_err(|e| format!("{}:1: {e}", path.display()))?;
    let expected = COLUMNS.len() + usize::from(with_rounds);
    let mut record = csv::StringRecord::new();
    loop {
        let line = reader.position().line();
        match reader.read_record(&mut record) {
            Ok(false) => break,
            Ok(true) => {
                data.rows += 1;
                let line = record.position().map_or(line, |p| p.line());
                match parse_row(&record, expected) {
                    Ok(sample) => data
                        .samples
                        .entry(sample.scenario.clone())
                        .or_default()
                        .push(sample),
                    Err(reason) => data.rejected.push(Rejection {
                        file: path.to_path_buf(),
                        line,
                        reason,
                    }),
                }
            }
            Err(e) => match e.kind() {
                csv::ErrorKind::Utf8 { pos, .. } => {
                    data.rows += 1;
                    data.rejected.push(Rejection {
                        file: path.to_path_buf(),
                        line: pos.as_ref().map_or(line, |p| p.line()),
                        reason: "not valid UTF-8".into(),
                    });
                }
                _ => return Err(format!("{}: cannot read: {e}", path.display())),
            },
        }
    }
    Ok(())
}

/// Whether `header` is [`COLUMNS`] followed by [`ROUNDS`] (true) or [`COLUMNS`] alone (false);
/// an error for anything else.
fn check_header(header: &csv::StringRecord) -> Result<bool, String> {
    let names: Vec<&str> = header.iter().collect();
    let with_rounds = names.len() == COLUMNS.len() + 1 && names[COLUMNS.len()] == ROUNDS;
    let leading = names.len().min(COLUMNS.len());
    if names[..leading] == COLUMNS[..] && (names.len() == COLUMNS.len() || with_rounds) {
        Ok(with_rounds)
    } else {
        Err(format!(
            "the header is `{}`, expected `{},[{ROUNDS}]`",
            names.join(","),
            COLUMNS.join(",")
        ))
    }
}

/// A data row as a [`Sample`], or why it cannot be one. `expected` is the header's field count.
fn parse_row(record: &csv::StringRecord, expected: usize) -> Result<Sample, String> {
    if record.len() != expected {
        return Err(format!(
            "{} fields, the header has {expected}",
            record.len()
        ));
    }
    let field = |i: usize| record.get(i).unwrap_or_default();
    let text = |i: usize| -> Result<String, String> {
        match field(i) {
            "" => Err(format!("{} is empty", COLUMNS[i])),
            s => Ok(s.to_string()),
        }
    };
    let whole = |i: usize, name: &str| -> Result<u64, String> {
        let s = field(i);
        s.parse::<u64>()
            .map_err(|_| format!("{name} `{s}` is not a whole number"))
    };
    let positive = |i: usize, name: &str| -> Result<u64, String> {
        match whole(i, name)? {
            0 => Err(format!("{name} is 0, must be at least 1")),
            n => Ok(n),
        }
    };
    // In column order, so that a row's first bad column is the one named.
    let scenario = text(0)?;
    let allocator = text(1)?;
    let size = text(2)?;
    let threads = positive(3, "threads")?;
    let state = text(4)?;
    let metric = text(5)?;
    whole(6, "iteration")?;
    let ms = {
        let s = field(7);
        match s.parse::<f64>() {
            Err(_) => return Err(format!("ms `{s}` is not a number")),
            Ok(v) if !v.is_finite() => return Err(format!("ms `{s}` is not finite")),
            Ok(v) if v < 0.0 => return Err(format!("ms `{s}` is negative")),
            Ok(v) => v,
        }
    };
    let failed = whole(8, "failed")?;
    let rounds = if expected > COLUMNS.len() {
        positive(COLUMNS.len(), ROUNDS)?
    } else {
        1
    };
    Ok(Sample {
        scenario,
        allocator,
        size,
        threads,
        rounds,
        state,
        metric,
        ms,
        failed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: &str = "scenario,allocator,size,threads,state,metric,iteration,ms,failed,device";

    fn read(text: &str) -> Result<Data, String> {
        let mut data = Data::default();
        read_csv(Path::new("x.csv"), text.as_bytes(), &mut data)?;
        Ok(data)
    }

    fn reasons(data: &Data) -> Vec<(u64, String)> {
        data.rejected
            .iter()
            .map(|r| (r.line, r.reason.clone()))
            .collect()
    }

    #[test]
    fn good_rows_parse_with_rounds_defaulting_to_one() {
        let data = read(&format!(
            "{HEADER}\na_malloc_only,toga,16,1048576,fresh,malloc,0,0.69,0,NVIDIA H100\n"
        ))
        .unwrap();
        assert!(data.rejected.is_empty());
        assert_eq!(data.rows, 1);
        let s = &data.samples["a_malloc_only"][0];
        assert_eq!((s.threads, s.rounds, s.ms, s.failed), (1048576, 1, 0.69, 0));
        assert_eq!(s.size, "16");
    }

    #[test]
    fn rounds_column_is_read() {
        let data = read(&format!(
            "{HEADER},rounds\nf_churn,toga,mixed 16-4096,1024,warm,malloc_free,0,1.5,0,GPU,8\n"
        ))
        .unwrap();
        assert_eq!(data.samples["f_churn"][0].rounds, 8);
        assert_eq!(data.samples["f_churn"][0].size, "mixed 16-4096");
    }

    #[test]
    fn bad_rows_are_rejected_with_their_line_and_reason() {
        let data = read(&format!(
            "{HEADER}\n\
             s,toga,16,1024,fresh,malloc,0,0.5,0,GPU\n\
             s,toga,16,1024,fresh,malloc,0,0.5\n\
             s,toga,16,many,fresh,malloc,0,0.5,0,GPU\n\
             s,toga,16,1024,fresh,malloc,0,NaN,0,GPU\n\
             s,toga,16,1024,fresh,malloc,0,-1,0,GPU\n\
             s,toga,16,1024,fresh,malloc,0,fast,0,GPU\n\
             s,toga,16,1024,fresh,malloc,0,0.5,x,GPU\n\
             s,,16,1024,fresh,malloc,0,0.5,0,GPU\n\
             s,toga,16,0,fresh,malloc,0,0.5,0,GPU\n\
             s,toga,16,1024,fresh,malloc,0,0.5,0,GPU,extra\n"
        ))
        .unwrap();
        assert_eq!(data.rows, 10);
        assert_eq!(data.samples["s"].len(), 1);
        assert_eq!(
            reasons(&data),
            [
                (3, "8 fields, the header has 10".to_string()),
                (4, "threads `many` is not a whole number".into()),
                (5, "ms `NaN` is not finite".into()),
                (6, "ms `-1` is negative".into()),
                (7, "ms `fast` is not a number".into()),
                (8, "failed `x` is not a whole number".into()),
                (9, "allocator is empty".into()),
                (10, "threads is 0, must be at least 1".into()),
                (11, "11 fields, the header has 10".into()),
            ]
        );
        assert_eq!(
            data.rejected[0].to_string(),
            "x.csv:3: rejected: 8 fields, the header has 10"
        );
    }

    #[test]
    fn bad_rounds_are_rejected() {
        let data = read(&format!(
            "{HEADER},rounds\ns,toga,16,1024,fresh,malloc,0,0.5,0,GPU,two\n\
             s,toga,16,1024,fresh,malloc,0,0.5,0,GPU\n"
        ))
        .unwrap();
        assert_eq!(
            reasons(&data),
            [
                (2, "rounds `two` is not a whole number".to_string()),
                (3, "10 fields, the header has 11".into()),
            ]
        );
    }

    #[test]
    fn a_wrong_header_is_an_error() {
        let e = read("a,b,c\n1,2,3\n").unwrap_err();
        assert!(e.starts_with("x.csv:1: the header is `a,b,c`"), "{e}");
        let e = read(&format!("{HEADER},rounds,more\n")).unwrap_err();
        assert!(e.contains("expected"), "{e}");
    }

    #[test]
    fn quoted_fields_are_fields() {
        let data = read(&format!(
            "{HEADER}\ns,toga,16,1024,fresh,malloc,0,0.5,0,\"GPU, with a comma\"\n"
        ))
        .unwrap();
        assert!(data.rejected.is_empty());
    }
}
