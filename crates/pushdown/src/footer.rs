//! Parquet footers: where the metadata is, parsing it with bounds, row-group byte ranges and
//! the Arrow schema of a table of objects.

use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use datafusion::arrow::datatypes::{Field, Schema, SchemaRef};
use datafusion::parquet::arrow::parquet_to_arrow_schema;
use datafusion::parquet::file::metadata::{ParquetMetaData, ParquetMetaDataReader};

use crate::Error;

/// Footer (file metadata) bytes an object may have at most; a larger declared size is refused
/// before anything is read (a hostile or damaged file).
pub const FOOTER_BYTES_MAX: u64 = 8 << 20;

/// The magic that starts and ends a Parquet file.
const MAGIC: &[u8; 4] = b"PAR1";

/// A Parquet object's parsed footer.
#[derive(Debug)]
pub struct Footer {
    /// The Thrift-encoded file metadata, as stored.
    pub bytes: Bytes,
    pub metadata: Arc<ParquetMetaData>,
    /// The Arrow schema of the file, without metadata.
    pub schema: SchemaRef,
}

impl Footer {
    /// Bytes to read from the end of an object for its footer, given its last 8 bytes: the
    /// metadata length plus those 8. Refuses an object that is not Parquet or whose declared
    /// footer does not fit.
    pub fn tail_len(name: &str, last8: &[u8], size: u64) -> Result<u64, Error> {
        if size < 12 || last8.len() != 8 || &last8[4..] != MAGIC {
            return Err(Error::BadQuery(format!("{name} is not a Parquet file (no PAR1 magic at its end)")));
        }
        let len = u64::from(u32::from_le_bytes(last8[..4].try_into().expect("4 bytes")));
        if len + 12 > size {
            return Err(Error::BadQuery(format!(
                "{name}: its Parquet footer claims {len} bytes, more than the file's {size}"
            )));
        }
        if len > FOOTER_BYTES_MAX {
            return Err(Error::BadQuery(format!(
                "{name}: its Parquet footer claims {len} bytes, more than the {FOOTER_BYTES_MAX} allowed"
            )));
        }
        Ok(len + 8)
    }

    /// Parses the metadata bytes (without the trailing length and magic) of object `name` of
    /// `size` bytes, and checks that every row group lies inside the file.
    pub fn parse(name: &str, bytes: Bytes, size: u64) -> Result<Self, Error> {
        let bad = |what: String| Error::BadQuery(format!("{name}: damaged Parquet footer: {what}"));
        // The Parquet decoder reserves memory for the lists a footer declares before it reads
        // them: a footer of 20 bytes declaring 2^31 row groups would abort the process. Every
        // list and string is checked against the bytes that remain first.
        thrift::check(&bytes).map_err(bad)?;
        let metadata = ParquetMetaDataReader::decode_metadata(&bytes).map_err(|e| bad(e.to_string()))?;
        let data_end = size.saturating_sub(bytes.len() as u64 + 8);
        let mut chunks: Vec<(u64, u64)> = Vec::new();
        for (i, group) in metadata.row_groups().iter().enumerate() {
            for column in group.columns() {
                // The raw fields, checked before anything (the Parquet reader included) calls
                // `byte_range`, which panics on negative values.
                let start = column.dictionary_page_offset().unwrap_or(column.data_page_offset());
                let len = column.compressed_size();
                let end = u64::try_from(start).ok().zip(u64::try_from(len).ok()).and_then(|(s, l)| s.checked_add(l));
                match end {
                    Some(end) if end <= data_end && column.data_page_offset() >= 0 => chunks.push((start as u64, end)),
                    _ => {
                        return Err(bad(format!(
                            "row group {i} claims bytes {start}+{len} outside the data (0..{data_end})"
                        )));
                    }
                }
            }
        }
        // Column chunks lie one after another: overlapping ones would make a reader fetch (and
        // hold) the same bytes many times over.
        chunks.sort_unstable();
        if let Some(pair) = chunks.windows(2).find(|pair| pair[1].0 < pair[0].1) {
            return Err(bad(format!(
                "column chunks at {}..{} and {}..{} overlap",
                pair[0].0, pair[0].1, pair[1].0, pair[1].1
            )));
        }
        let file = metadata.file_metadata();
        let schema = parquet_to_arrow_schema(file.schema_descr(), None).map_err(|e| bad(e.to_string()))?;
        let fields: Vec<Field> =
            schema.fields().iter().map(|f| f.as_ref().clone().with_metadata(Default::default())).collect();
        Ok(Self { bytes, metadata: Arc::new(metadata), schema: Arc::new(Schema::new(fields)) })
    }

    pub fn row_groups(&self) -> usize {
        self.metadata.num_row_groups()
    }

    /// The bytes of row group `idx`: from its first column chunk's first page to its last
    /// one's end. `None` for a row group without columns.
    pub fn row_group_range(&self, idx: usize) -> Option<Range<u64>> {
        let group = self.metadata.row_group(idx);
        let ranges = group.columns().iter().map(|c| {
            let (start, len) = c.byte_range();
            start..start + len
        });
        ranges.reduce(|a, b| a.start.min(b.start)..a.end.max(b.end))
    }
}

/// The schema of a table made of `footers`' objects: all must have the same columns (names,
/// types and nullability, in order). `names` name the objects for the error.
pub fn table_schema(footers: &[(&str, &Footer)]) -> Result<SchemaRef, Error> {
    let Some((first_name, first)) = footers.first() else {
        return Err(Error::BadQuery("the table has no objects".into()));
    };
    for (name, footer) in &footers[1..] {
        if footer.schema.fields() != first.schema.fields() {
            return Err(Error::BadQuery(format!(
                "{name} and {first_name} have different columns ({} vs {}): query them separately",
                describe(&footer.schema),
                describe(&first.schema)
            )));
        }
    }
    Ok(Arc::clone(&first.schema))
}

fn describe(schema: &Schema) -> String {
    let fields: Vec<String> = schema.fields().iter().map(|f| format!("{} {}", f.name(), f.data_type())).collect();
    fields.join(", ")
}

/// A walk over Thrift compact-protocol bytes that checks, before the Parquet decoder sees them,
/// that no list, map or string claims more elements or bytes than remain (each element takes at
/// least one byte), and that nesting stays shallow. It decodes nothing.
mod thrift {
    /// Structs and containers nested deeper than this are refused (real footers nest ~6 deep).
    const DEPTH_MAX: usize = 64;

    struct Walker<'a> {
        bytes: &'a [u8],
        at: usize,
    }

    pub(super) fn check(bytes: &[u8]) -> Result<(), String> {
        let mut walker = Walker { bytes, at: 0 };
        walker.structure(0)
    }

    impl Walker<'_> {
        fn left(&self) -> usize {
            self.bytes.len() - self.at
        }

        fn byte(&mut self) -> Result<u8, String> {
            let byte = *self.bytes.get(self.at).ok_or("ends inside a value")?;
            self.at += 1;
            Ok(byte)
        }

        fn varint(&mut self) -> Result<u64, String> {
            let mut value = 0u64;
            for shift in (0..70).step_by(7) {
                let byte = self.byte()?;
                value |= u64::from(byte & 0x7f).checked_shl(shift).unwrap_or(0);
                if byte & 0x80 == 0 {
                    return Ok(value);
                }
            }
            Err("a varint longer than 10 bytes".into())
        }

        fn skip(&mut self, len: u64, what: &str) -> Result<(), String> {
            if len > self.left() as u64 {
                return Err(format!("{what} of {len} bytes with {} left", self.left()));
            }
            self.at += len as usize;
            Ok(())
        }

        fn count(&mut self, declared: u64, what: &str) -> Result<u64, String> {
            if declared > self.left() as u64 {
                return Err(format!("a {what} of {declared} elements in {} bytes", self.left()));
            }
            Ok(declared)
        }

        fn structure(&mut self, depth: usize) -> Result<(), String> {
            if depth > DEPTH_MAX {
                return Err("nested too deep".into());
            }
            loop {
                let header = self.byte()?;
                let kind = header & 0x0f;
                if kind == 0 {
                    return Ok(());
                }
                if header >> 4 == 0 {
                    self.varint()?; // the field id, in full
                }
                self.value(kind, depth)?;
            }
        }

        fn value(&mut self, kind: u8, depth: usize) -> Result<(), String> {
            match kind {
                1 | 2 => Ok(()), // booleans live in the field header
                3 => self.skip(1, "a byte"),
                4..=6 => self.varint().map(drop),
                7 => self.skip(8, "a double"),
                8 => {
                    let len = self.varint()?;
                    self.skip(len, "a string")
                }
                9 | 10 => {
                    let header = self.byte()?;
                    let element = header & 0x0f;
                    let size = match header >> 4 {
                        15 => self.varint()?,
                        small => u64::from(small),
                    };
                    for _ in 0..self.count(size, "list")? {
                        self.element(element, depth + 1)?;
                    }
                    Ok(())
                }
                11 => {
                    let size = self.varint()?;
                    if size == 0 {
                        return Ok(());
                    }
                    let size = self.count(size, "map")?;
                    let types = self.byte()?;
                    for _ in 0..size {
                        self.element(types >> 4, depth + 1)?;
                        self.element(types & 0x0f, depth + 1)?;
                    }
                    Ok(())
                }
                12 => self.structure(depth + 1),
                13 => self.skip(16, "a uuid"),
                other => Err(format!("unknown Thrift type {other}")),
            }
        }

        /// A list, set or map element: booleans take a byte of their own there.
        fn element(&mut self, kind: u8, depth: usize) -> Result<(), String> {
            match kind {
                1 | 2 => self.skip(1, "a boolean"),
                other => self.value(other, depth),
            }
        }
    }
}
