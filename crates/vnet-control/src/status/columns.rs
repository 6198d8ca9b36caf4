//! Fixed-width text tables (`show interfaces`, `vnetctl --etcd hosts`, ...): one layout per
//! table, through which its header and its rows are both written, so the two cannot drift.

use std::fmt::{self, Display, Write};

/// One column of a table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Col {
    /// Padded to this width, text on the left.
    Left(usize),
    /// Padded to this width, text on the right.
    Right(usize),
    /// Not padded (the last column).
    Rest,
}

/// A table's columns, one space apart.
#[derive(Debug, Clone, Copy)]
pub struct Columns(pub &'static [Col]);

impl Columns {
    /// Writes one line of the table: each cell in its column (as `{:<W}` / `{:>W}` would).
    pub fn row(&self, out: &mut impl Write, cells: &[&dyn Display]) -> fmt::Result {
        debug_assert_eq!(cells.len(), self.0.len(), "one cell per column");
        for (i, (col, cell)) in self.0.iter().zip(cells).enumerate() {
            if i > 0 {
                out.write_char(' ')?;
            }
            match *col {
                Col::Left(w) => write!(out, "{cell:<w$}")?,
                Col::Right(w) => write!(out, "{cell:>w$}")?,
                Col::Rest => write!(out, "{cell}")?,
            }
        }
        out.write_char('\n')
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_is_its_cells_padded_one_space_apart() {
        const T: Columns = Columns(&[Col::Left(4), Col::Right(3), Col::Rest]);
        let mut s = String::new();
        T.row(&mut s, &[&"ab", &7, &"rest of it"]).unwrap();
        T.row(&mut s, &[&"toolong", &1234, &""]).unwrap();
        assert_eq!(s, "ab     7 rest of it\ntoolong 1234 \n");
    }
}
