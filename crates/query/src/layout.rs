//! The aligned layout's input for Parquet objects: the byte ranges of a file's row groups,
//! which a PUT through the smart client stores each inside one data chunk
//! ([`client::Alignment`]), so the node that holds a row group reads it from its own drive.

use bytes::Bytes;
use pushdown::Footer;

use crate::plan::FOOTER_GUESS_BYTES;

/// The alignment for a Parquet file of `size` bytes (its row groups), reading its footer with
/// `read(offset, len)`. `None` when the file is not Parquet, its footer is damaged or too
/// large, or the reads fail: such a file is stored plain.
pub fn parquet_alignment(
    size: u64,
    read: &mut dyn FnMut(u64, usize) -> std::io::Result<Vec<u8>>,
) -> Option<client::Alignment> {
    if size < 12 {
        return None;
    }
    let guess = size.min(FOOTER_GUESS_BYTES);
    let mut tail = read(size - guess, guess as usize).ok()?;
    if tail.len() as u64 != guess {
        return None;
    }
    let needed = Footer::tail_len("object", &tail[tail.len() - 8..], size).ok()?;
    if needed > guess {
        tail = read(size - needed, needed as usize).ok()?;
    }
    from_tail(size, &read(0, 4).ok()?, &tail)
}

/// The alignment of a Parquet object already stored (its footer read through `client`);
/// `None` when it is not Parquet or its footer is damaged.
pub async fn object_alignment(
    client: &client::Client,
    info: &client::ObjectInfo,
) -> Result<Option<client::Alignment>, client::Error> {
    let size = info.meta.size;
    if size < 12 {
        return Ok(None);
    }
    let mut head = [0u8; 4];
    client.read_at(info, 0, &mut head).await?;
    if &head != b"PAR1" {
        return Ok(None);
    }
    match crate::plan::read_footer(client, "object", info).await {
        Ok(footer) => Ok(Some(row_groups(size, &footer))),
        Err(crate::Error::Client(e)) => Err(e),
        Err(_) => Ok(None),
    }
}

fn row_groups(size: u64, footer: &Footer) -> client::Alignment {
    let ranges = (0..footer.row_groups()).filter_map(|g| footer.row_group_range(g)).collect();
    client::Alignment { size, ranges }
}

/// The row groups of a Parquet file of `size` bytes from its first 4 bytes and a tail that
/// holds its whole footer.
fn from_tail(size: u64, head: &[u8], tail: &[u8]) -> Option<client::Alignment> {
    if head != b"PAR1" || tail.len() < 8 {
        return None;
    }
    let needed = Footer::tail_len("object", &tail[tail.len() - 8..], size).ok()?;
    let metadata = tail.get(tail.len().checked_sub(needed as usize)?..tail.len() - 8)?.to_vec();
    let footer = Footer::parse("object", Bytes::from(metadata), size).ok()?;
    Some(row_groups(size, &footer))
}

/// [`parquet_alignment`] of a file held in memory.
pub fn parquet_alignment_of(bytes: &[u8]) -> Option<client::Alignment> {
    parquet_alignment(bytes.len() as u64, &mut |offset, len| {
        let start = usize::try_from(offset).map_err(std::io::Error::other)?;
        Ok(bytes.get(start..start + len).map(<[u8]>::to_vec).unwrap_or_default())
    })
}

/// Whether `key`'s name says CSV or JSON lines (`.csv`, `.tsv`, `.json`, `.jsonl`, `.ndjson`):
/// objects S3 Select evaluates on the nodes when they are one piece, so a multipart upload of
/// one is worth storing again whole ([`client::Client::consolidate`]).
pub fn is_records_key(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    [".csv", ".tsv", ".json", ".jsonl", ".ndjson"].iter().any(|suffix| key.ends_with(suffix))
}

/// Whether an object named `key` uploaded in parts is worth storing again as one piece
/// ([`client::Client::consolidate`]): CSV and JSON lines ([`is_records_key`]), which the nodes
/// then select over, and `.npy` tables, whose rows a gather then reads in one batched request
/// per node instead of piece by piece.
pub fn wants_one_piece(key: &str) -> bool {
    is_records_key(key) || key.to_ascii_lowercase().ends_with(".npy")
}

/// How `key`'s name says a table's object writes its records: `.csv` (commas) and `.tsv`
/// (tabs) CSV with a header line, `.json`, `.jsonl` and `.ndjson` JSON lines; `None` for any
/// other name (Parquet). An empty CSV field is NULL, as SQL engines read CSV.
pub fn table_records_format(key: &str) -> Option<pushdown::RecordFormat> {
    let key = key.to_ascii_lowercase();
    let csv = |delimiter| {
        pushdown::RecordFormat::Csv(pushdown::records::CsvFormat {
            header: true,
            delimiter,
            quote: b'"',
            escape: None,
            comment: None,
            empty_is_null: true,
        })
    };
    if key.ends_with(".csv") {
        Some(csv(b','))
    } else if key.ends_with(".tsv") {
        Some(csv(b'\t'))
    } else if [".json", ".jsonl", ".ndjson"].iter().any(|suffix| key.ends_with(suffix)) {
        Some(pushdown::RecordFormat::JsonLines)
    } else {
        None
    }
}

/// Whether `key`'s name says its bytes are compressed (`.gz`, `.bz2`, `.zst`, ...).
pub fn is_compressed_key(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    [".gz", ".gzip", ".bz2", ".zst", ".zstd", ".xz", ".lz4"].iter().any(|suffix| key.ends_with(suffix))
}
