//! Reading the benchmark CSVs: every `*.csv` and `*.csv.gz` (gzip-compressed, as
//! `docs/results/` keeps them) of the results directory, row by row, keeping the rows that parse
//! and naming the ones that do not.

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

#[cfg(test)]
impl Sample {
    /// A sample of 1000 threads, one round each and no failures, for the tables' tests.
    pub fn of(
        scenario: &str,
        allocator: &str,
        size: &str,
        state: &str,
        metric: &str,
        ms: f64,
    ) -> Self {
        Self {
            scenario: scenario.into(),
            allocator: allocator.into(),
            size: size.into(),
            threads: 1000,
            rounds: 1,
            state: state.into(),
            metric: metric.into(),
            ms,
            failed: 0,
        }
    }
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

/// Read every `*.csv` and `*.csv.gz` in `dir` (by name order). Errors (one line each): `dir`
/// cannot be listed, it holds no CSV, it holds one table both plain and compressed, a file
/// cannot be read or decompressed, a header is not [`COLUMNS`] with an optional [`ROUNDS`].
pub fn read_dir(dir: &Path) -> Result<Data, String> {
    let entries = std::fs::read_dir(dir)
        .map_err(|e| format!("{}: cannot read the results directory: {e}", dir.display()))?;
    let mut files = Vec::new();
    for entry in entries {
        let path = entry
            .map_err(|e| format!("{}: cannot read the results directory: {e}", dir.display()))?
            .path();
        if csv_kind(&path).is_some() && path.is_file() {
            files.push(path);
        }
    }
    if files.is_empty() {
        return Err(format!("{}: no CSV files there", dir.display()));
    }
    files.sort();
    for path in &files {
        if csv_kind(path) == Some(Compression::Gzip) && files.contains(&path.with_extension("")) {
            return Err(format!(
                "{}: the same table is also there uncompressed; keep one of the two",
                path.display()
            ));
        }
    }
    let mut data = Data::default();
    for path in files {
        let file = std::fs::File::open(&path)
            .map_err(|e| format!("{}: cannot read: {e}", path.display()))?;
        match csv_kind(&path) {
            Some(Compression::Gzip) => {
                read_csv(&path, flate2::read::GzDecoder::new(file), &mut data)?
            }
            _ => read_csv(&path, file, &mut data)?,
        }
        data.files += 1;
    }
    Ok(data)
}

/// How a CSV file is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Compression {
    /// `*.csv`.
    None,
    /// `*.csv.gz`.
    Gzip,
}

/// Whether `path` names a CSV, and how it is stored.
fn csv_kind(path: &Path) -> Option<Compression> {
    let name = path.file_name()?.to_str()?;
    if name.ends_with(".csv") {
        Some(Compression::None)
    } else if name.ends_with(".csv.gz") {
        Some(Compression::Gzip)
    } else {
        None
    }
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

    /// A results directory holding `files` (name, bytes).
    fn dir_with(files: &[(&str, &[u8])]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (name, bytes) in files {
            std::fs::write(dir.path().join(name), bytes).unwrap();
        }
        dir
    }

    fn gzip(text: &str) -> Vec<u8> {
        use std::io::Write;
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        enc.write_all(text.as_bytes()).unwrap();
        enc.finish().unwrap()
    }

    #[test]
    fn compressed_csvs_read_as_the_plain_ones() {
        let a = format!("{HEADER}\na_malloc_only,toga,16,1048576,fresh,malloc,0,0.69,0,GPU\n");
        let b = format!("{HEADER}\nb_free,toga,16,1048576,fresh,free,0,0.07,0,GPU\nb_free,x\n");
        let plain = dir_with(&[("a.csv", a.as_bytes()), ("b.csv", b.as_bytes())]);
        let packed = dir_with(&[("a.csv.gz", &gzip(&a)), ("b.csv", b.as_bytes())]);
        let (plain, packed) = (
            read_dir(plain.path()).unwrap(),
            read_dir(packed.path()).unwrap(),
        );
        assert_eq!((packed.files, packed.rows), (2, 3));
        assert_eq!((plain.files, plain.rows), (packed.files, packed.rows));
        assert_eq!(plain.samples, packed.samples);
        assert_eq!(packed.rejected.len(), 1);
    }

    #[test]
    fn a_table_both_plain_and_compressed_is_refused() {
        let a = format!("{HEADER}\na_malloc_only,toga,16,1048576,fresh,malloc,0,0.69,0,GPU\n");
        let dir = dir_with(&[("a.csv", a.as_bytes()), ("a.csv.gz", &gzip(&a))]);
        let e = read_dir(dir.path()).unwrap_err();
        assert!(
            e.contains("a.csv.gz: the same table is also there uncompressed"),
            "{e}"
        );
    }

    #[test]
    fn a_broken_gzip_file_is_an_error_naming_it() {
        let mut bytes = gzip(&format!("{HEADER}\n"));
        bytes.truncate(bytes.len() / 2);
        let dir = dir_with(&[("a.csv.gz", &bytes)]);
        let e = read_dir(dir.path()).unwrap_err();
        assert!(e.contains("a.csv.gz"), "{e}");
        let dir = dir_with(&[("notes.gz", b"x"), ("a.csv.txt", b"x")]);
        assert!(read_dir(dir.path()).unwrap_err().contains("no CSV files"));
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
