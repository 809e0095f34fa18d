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
        let metadata = ParquetMetaDataReader::decode_metadata(&bytes).map_err(|e| bad(e.to_string()))?;
        let data_end = size.saturating_sub(bytes.len() as u64 + 8);
        for (i, group) in metadata.row_groups().iter().enumerate() {
            for column in group.columns() {
                // The raw fields, checked before anything (the Parquet reader included) calls
                // `byte_range`, which panics on negative values.
                let start = column.dictionary_page_offset().unwrap_or(column.data_page_offset());
                let len = column.compressed_size();
                let end = u64::try_from(start).ok().zip(u64::try_from(len).ok()).and_then(|(s, l)| s.checked_add(l));
                if end.is_none_or(|end| end > data_end) || column.data_page_offset() < 0 {
                    return Err(bad(format!(
                        "row group {i} claims bytes {start}+{len} outside the data (0..{data_end})"
                    )));
                }
            }
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
