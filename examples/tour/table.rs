//! A plain-text table for the tour's summary, and small formatting helpers.

use std::time::Duration;

/// A table with a header row; columns are sized to their widest cell.
#[derive(Debug, Default)]
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
    /// Columns aligned right (numbers).
    right: Vec<bool>,
}

impl Table {
    /// A table with these column titles; a title starting with `>` is right-aligned (the
    /// `>` is not shown).
    pub fn new(header: &[&str]) -> Self {
        Table {
            header: header
                .iter()
                .map(|h| h.trim_start_matches('>').to_string())
                .collect(),
            right: header.iter().map(|h| h.starts_with('>')).collect(),
            rows: Vec::new(),
        }
    }

    /// Adds a row (missing cells are empty, extra cells are ignored).
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// Renders the table.
    pub fn render(&self) -> String {
        let cols = self.header.len();
        let width = |c: usize| {
            self.rows
                .iter()
                .filter_map(|r| r.get(c))
                .chain(std::iter::once(&self.header[c]))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        };
        let widths: Vec<usize> = (0..cols).map(width).collect();
        let rule = |left: &str, mid: &str, right: &str| {
            let parts: Vec<String> = widths.iter().map(|w| "─".repeat(w + 2)).collect();
            format!("{left}{}{right}\n", parts.join(mid))
        };
        let line = |cells: &[String]| {
            let parts: Vec<String> = (0..cols)
                .map(|c| {
                    let cell = cells.get(c).map(String::as_str).unwrap_or("");
                    if self.right[c] {
                        format!(" {cell:>w$} ", w = widths[c])
                    } else {
                        format!(" {cell:<w$} ", w = widths[c])
                    }
                })
                .collect();
            format!("│{}│\n", parts.join("│"))
        };
        let mut out = rule("┌", "┬", "┐");
        out += &line(&self.header);
        out += &rule("├", "┼", "┤");
        for row in &self.rows {
            out += &line(row);
        }
        out += &rule("└", "┴", "┘");
        out
    }
}

/// `1.2 KiB`, `3.4 MiB`, `512 B`.
pub fn bytes(n: u64) -> String {
    const KIB: f64 = 1024.0;
    let n_f = n as f64;
    if n_f < KIB {
        format!("{n} B")
    } else if n_f < KIB * KIB {
        format!("{:.1} KiB", n_f / KIB)
    } else {
        format!("{:.1} MiB", n_f / (KIB * KIB))
    }
}

/// `850 µs`, `12.3 ms`, `1.20 s`.
pub fn duration(d: Duration) -> String {
    let micros = d.as_micros();
    if micros < 1000 {
        format!("{micros} µs")
    } else if micros < 1_000_000 {
        format!("{:.1} ms", micros as f64 / 1000.0)
    } else {
        format!("{:.2} s", d.as_secs_f64())
    }
}
