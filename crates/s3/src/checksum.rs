//! S3's flexible checksums (`x-amz-checksum-*`): the algorithms, how a checksum is stored with
//! an object or a part, and how a multipart object's checksum is built from its parts'.
//!
//! Stored as headers of the object's record (no format change): an object keeps one
//! `x-amz-checksum-<algorithm>` value and `x-amz-checksum-type`; a part keeps every checksum
//! computed over it; an upload's marker keeps the algorithm and type CreateMultipartUpload
//! asked for. Reads never replay these names as ordinary headers: GET and HEAD return them only
//! with `x-amz-checksum-mode: ENABLED`.
//!
//! Every object gets a checksum: the one the client sent (verified at the end of the body),
//! else CRC64NVME computed by the gateway, as S3 does since 2025. A multipart object gets the
//! upload's algorithm, combined over the parts as its type says: COMPOSITE is the checksum of
//! the parts' binary checksums with `-N` appended; FULL_OBJECT (CRC only) is the CRC of the
//! whole object, combined from the parts' CRCs and sizes without reading a byte.

use base64::Engine as _;
use s3s::checksum::ChecksumHasher;
use s3s::crypto::{self, Checksum as _};
use s3s::dto::{Checksum, ChecksumAlgorithm, ChecksumType};
use s3s::{S3Error, S3ErrorCode, S3Result};

/// The stored type of an object's checksum.
const TYPE_HEADER: &str = "x-amz-checksum-type";
/// The algorithm an upload was created with (on its marker only).
const UPLOAD_ALGORITHM_HEADER: &str = "x-amz-checksum-algorithm";

/// The checksum algorithms of S3's flexible checksums, in one place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Algorithm {
    Crc32,
    Crc32c,
    Crc64Nvme,
    Sha1,
    Sha256,
}

impl Algorithm {
    pub(crate) const ALL: [Algorithm; 5] =
        [Algorithm::Crc32, Algorithm::Crc32c, Algorithm::Crc64Nvme, Algorithm::Sha1, Algorithm::Sha256];

    /// The algorithm S3 (and the gateway) computes when the client sends none.
    pub(crate) const DEFAULT: Algorithm = Algorithm::Crc64Nvme;

    /// S3's name (`ChecksumAlgorithm`).
    pub(crate) fn name(self) -> &'static str {
        match self {
            Algorithm::Crc32 => "CRC32",
            Algorithm::Crc32c => "CRC32C",
            Algorithm::Crc64Nvme => "CRC64NVME",
            Algorithm::Sha1 => "SHA1",
            Algorithm::Sha256 => "SHA256",
        }
    }

    fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.name().eq_ignore_ascii_case(name.trim()))
    }

    /// The header (or trailer) carrying this checksum, lowercase.
    pub(crate) fn header(self) -> &'static str {
        match self {
            Algorithm::Crc32 => "x-amz-checksum-crc32",
            Algorithm::Crc32c => "x-amz-checksum-crc32c",
            Algorithm::Crc64Nvme => "x-amz-checksum-crc64nvme",
            Algorithm::Sha1 => "x-amz-checksum-sha1",
            Algorithm::Sha256 => "x-amz-checksum-sha256",
        }
    }

    pub(crate) fn from_header(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.header().eq_ignore_ascii_case(name.trim()))
    }

    /// This algorithm's value in an s3s checksum set.
    pub(crate) fn field(self, checksum: &Checksum) -> Option<&String> {
        match self {
            Algorithm::Crc32 => checksum.checksum_crc32.as_ref(),
            Algorithm::Crc32c => checksum.checksum_crc32c.as_ref(),
            Algorithm::Crc64Nvme => checksum.checksum_crc64nvme.as_ref(),
            Algorithm::Sha1 => checksum.checksum_sha1.as_ref(),
            Algorithm::Sha256 => checksum.checksum_sha256.as_ref(),
        }
    }

    fn set_field(self, checksum: &mut Checksum, value: String) {
        let field = match self {
            Algorithm::Crc32 => &mut checksum.checksum_crc32,
            Algorithm::Crc32c => &mut checksum.checksum_crc32c,
            Algorithm::Crc64Nvme => &mut checksum.checksum_crc64nvme,
            Algorithm::Sha1 => &mut checksum.checksum_sha1,
            Algorithm::Sha256 => &mut checksum.checksum_sha256,
        };
        *field = Some(value);
    }

    /// A checksum set holding only `value`, as this algorithm's.
    pub(crate) fn only(self, value: String) -> Checksum {
        let mut checksum = Checksum::default();
        self.set_field(&mut checksum, value);
        checksum
    }

    /// Bytes of this checksum's digest (its header carries them in base64).
    pub(crate) fn digest_bytes(self) -> usize {
        match self {
            Algorithm::Crc32 | Algorithm::Crc32c => 4,
            Algorithm::Crc64Nvme => 8,
            Algorithm::Sha1 => 20,
            Algorithm::Sha256 => 32,
        }
    }

    /// Turns this algorithm on in `hasher`.
    pub(crate) fn enable(self, hasher: &mut ChecksumHasher) {
        match self {
            Algorithm::Crc32 => hasher.crc32 = Some(crypto::Crc32::new()),
            Algorithm::Crc32c => hasher.crc32c = Some(crypto::Crc32c::new()),
            Algorithm::Crc64Nvme => hasher.crc64nvme = Some(crypto::Crc64Nvme::new()),
            Algorithm::Sha1 => hasher.sha1 = Some(crypto::Sha1::new()),
            Algorithm::Sha256 => hasher.sha256 = Some(crypto::Sha256::new()),
        }
    }

    /// The CRC parameters for combining, for the CRC algorithms.
    fn crc(self) -> Option<crc_fast::CrcAlgorithm> {
        match self {
            Algorithm::Crc32 => Some(crc_fast::CrcAlgorithm::Crc32IsoHdlc),
            Algorithm::Crc32c => Some(crc_fast::CrcAlgorithm::Crc32Iscsi),
            Algorithm::Crc64Nvme => Some(crc_fast::CrcAlgorithm::Crc64Nvme),
            Algorithm::Sha1 | Algorithm::Sha256 => None,
        }
    }

    /// The one algorithm a request's `x-amz-checksum-*` headers name, if any (two at once are
    /// refused earlier, by `body::Expected`).
    pub(crate) fn sent(checksums: &Checksum) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.field(checksums).is_some())
    }

    pub(crate) fn of_dto(algorithm: &ChecksumAlgorithm) -> S3Result<Self> {
        Self::from_name(algorithm.as_str()).ok_or_else(|| {
            S3Error::with_message(
                S3ErrorCode::InvalidRequest,
                format!("Checksum algorithm {:?} is not supported", algorithm.as_str()),
            )
        })
    }

    fn dto(self) -> ChecksumAlgorithm {
        ChecksumAlgorithm::from(self.name().to_owned())
    }
}

/// A flexible checksum's value: the base64 of its digest.
pub(crate) fn decode_digest(value: &str) -> Option<Vec<u8>> {
    base64::engine::general_purpose::STANDARD.decode(value.trim_ascii()).ok()
}

fn encode_digest(digest: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(digest)
}

/// How a multipart object's checksum is made from its parts' (S3's `ChecksumType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// The checksum of the whole object (every single-piece object's; CRCs only for multipart).
    FullObject,
    /// The checksum of the parts' checksums, with `-N`.
    Composite,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::FullObject => "FULL_OBJECT",
            Kind::Composite => "COMPOSITE",
        }
    }

    fn from_name(name: &str) -> Option<Self> {
        [Kind::FullObject, Kind::Composite].into_iter().find(|k| k.name().eq_ignore_ascii_case(name.trim()))
    }
}

/// The checksum an object records.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ObjectChecksum {
    pub(crate) algorithm: Algorithm,
    /// Base64 digest; `-N` appended for a composite one.
    pub(crate) value: String,
    pub(crate) kind: Kind,
}

impl ObjectChecksum {
    /// The checksum in an object's stored headers, if it has one.
    pub(crate) fn stored(headers: &[(String, String)]) -> Option<Self> {
        let (algorithm, value) =
            headers.iter().find_map(|(name, value)| Some((Algorithm::from_header(name)?, value)))?;
        let kind = headers
            .iter()
            .find(|(name, _)| name == TYPE_HEADER)
            .and_then(|(_, value)| Kind::from_name(value))
            .unwrap_or(Kind::FullObject);
        Some(Self { algorithm, value: value.clone(), kind })
    }

    /// The headers that store it.
    pub(crate) fn headers(&self) -> Vec<(String, String)> {
        vec![
            (self.algorithm.header().to_owned(), self.value.clone()),
            (TYPE_HEADER.to_owned(), self.kind.name().to_owned()),
        ]
    }

    /// As a response's checksum fields.
    pub(crate) fn dto(&self) -> Checksum {
        let mut checksum =
            Checksum { checksum_type: Some(ChecksumType::from(self.kind.name().to_owned())), ..Default::default() };
        self.algorithm.set_field(&mut checksum, self.value.clone());
        checksum
    }
}

/// The headers storing every checksum in `computed` (a part keeps them all).
pub(crate) fn headers_of(computed: &Checksum) -> Vec<(String, String)> {
    Algorithm::ALL
        .into_iter()
        .filter_map(|a| a.field(computed).map(|value| (a.header().to_owned(), value.clone())))
        .collect()
}

/// The fields of `computed` for `algorithm` only (what a response reports).
pub(crate) fn only(computed: &Checksum, algorithm: Algorithm) -> Checksum {
    algorithm.field(computed).map(|value| algorithm.only(value.clone())).unwrap_or_default()
}

fn invalid_request(message: impl Into<String>) -> S3Error {
    S3Error::with_message(S3ErrorCode::InvalidRequest, message.into())
}

/// The checksum a multipart upload makes: its algorithm and type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct UploadChecksum {
    pub(crate) algorithm: Algorithm,
    pub(crate) kind: Kind,
    /// Asked for by CreateMultipartUpload (else the default, which S3 lists as none).
    pub(crate) declared: bool,
}

impl UploadChecksum {
    /// CRC64NVME over the whole object: what an upload created without an algorithm gets.
    const DEFAULT: UploadChecksum =
        UploadChecksum { algorithm: Algorithm::DEFAULT, kind: Kind::FullObject, declared: false };

    /// What CreateMultipartUpload's `x-amz-checksum-algorithm` and `x-amz-checksum-type` ask
    /// for, checked as S3 checks them: a type needs an algorithm, SHA is composite only,
    /// CRC64NVME full-object only; CRC32 and CRC32C are composite unless asked otherwise.
    pub(crate) fn requested(algorithm: Option<&ChecksumAlgorithm>, kind: Option<&ChecksumType>) -> S3Result<Self> {
        let kind = match kind {
            None => None,
            Some(kind) => Some(Kind::from_name(kind.as_str()).ok_or_else(|| {
                invalid_request(format!("Value for x-amz-checksum-type header is invalid: {:?}", kind.as_str()))
            })?),
        };
        let Some(algorithm) = algorithm else {
            return match kind {
                None => Ok(Self::DEFAULT),
                Some(_) => Err(invalid_request(
                    "The x-amz-checksum-type header can only be used with the x-amz-checksum-algorithm header.",
                )),
            };
        };
        let algorithm = Algorithm::of_dto(algorithm)?;
        let kind = match (algorithm.crc(), algorithm, kind) {
            (None, _, Some(Kind::FullObject)) | (_, Algorithm::Crc64Nvme, Some(Kind::Composite)) => {
                return Err(invalid_request(format!(
                    "The {} checksum algorithm does not support the {} checksum type.",
                    algorithm.name(),
                    kind.map_or("", Kind::name)
                )));
            }
            (_, _, Some(kind)) => kind,
            (_, Algorithm::Crc64Nvme, None) => Kind::FullObject,
            (_, _, None) => Kind::Composite,
        };
        Ok(Self { algorithm, kind, declared: true })
    }

    /// The headers an upload's marker keeps (none for the default).
    pub(crate) fn marker_headers(&self) -> Vec<(String, String)> {
        if !self.declared {
            return Vec::new();
        }
        vec![
            (UPLOAD_ALGORITHM_HEADER.to_owned(), self.algorithm.name().to_owned()),
            (TYPE_HEADER.to_owned(), self.kind.name().to_owned()),
        ]
    }

    /// The checksum an upload was created with, from its marker's headers.
    pub(crate) fn of_upload(headers: &[(String, String)]) -> Self {
        let value = |wanted: &str| headers.iter().find(|(name, _)| name == wanted).map(|(_, v)| v.as_str());
        match value(UPLOAD_ALGORITHM_HEADER).and_then(Algorithm::from_name) {
            None => Self::DEFAULT,
            Some(algorithm) => {
                let kind = value(TYPE_HEADER).and_then(Kind::from_name).unwrap_or(Kind::Composite);
                Self { algorithm, kind, declared: true }
            }
        }
    }

    /// An upload's headers less the checksum ones: what its object keeps of them.
    pub(crate) fn object_headers(upload: &[(String, String)]) -> Vec<(String, String)> {
        upload.iter().filter(|(name, _)| name != UPLOAD_ALGORITHM_HEADER && name != TYPE_HEADER).cloned().collect()
    }

    /// How S3 reports the upload's algorithm and type (nothing for the default).
    pub(crate) fn reported(&self) -> (Option<ChecksumAlgorithm>, Option<ChecksumType>) {
        if self.declared {
            (Some(self.algorithm.dto()), Some(ChecksumType::from(self.kind.name().to_owned())))
        } else {
            (None, None)
        }
    }

    /// The algorithms to compute over a part whose request sent a checksum of `sent`: the
    /// upload's (sent or not: the gateway computes it), and the sent one. A declared upload
    /// takes only its own algorithm, as S3.
    pub(crate) fn part_algorithms(&self, sent: Option<Algorithm>) -> S3Result<Vec<Algorithm>> {
        match sent {
            Some(sent) if self.declared && sent != self.algorithm => Err(invalid_request(format!(
                "Checksum Type mismatch occurred, expected checksum Type: {}, actual checksum Type: {}",
                self.algorithm.name().to_ascii_lowercase(),
                sent.name().to_ascii_lowercase()
            ))),
            Some(sent) if sent != self.algorithm => Ok(vec![self.algorithm, sent]),
            _ => Ok(vec![self.algorithm]),
        }
    }

    /// The object's checksum from its parts' (each `(size, stored headers)`, in order); `None`
    /// when a part has no checksum of the algorithm (a part stored before checksums were kept).
    pub(crate) fn combine<'a>(
        &self,
        parts: impl ExactSizeIterator<Item = (u64, &'a [(String, String)])>,
    ) -> Option<ObjectChecksum> {
        let count = parts.len();
        let header = self.algorithm.header();
        let mut digests = Vec::with_capacity(count);
        for (size, headers) in parts {
            let value = headers.iter().find(|(name, _)| name == header)?;
            let digest = decode_digest(&value.1).filter(|d| d.len() == self.algorithm.digest_bytes())?;
            digests.push((size, digest));
        }
        let value = match (self.kind, self.algorithm.crc()) {
            (Kind::FullObject, Some(crc)) => {
                let mut combined: Option<u64> = None;
                for (size, digest) in &digests {
                    let part = digest.iter().fold(0u64, |acc, b| (acc << 8) | u64::from(*b));
                    combined = Some(match combined {
                        None => part,
                        Some(before) => crc_fast::checksum_combine(crc, before, part, *size),
                    });
                }
                let combined = combined?;
                let width = self.algorithm.digest_bytes();
                encode_digest(&combined.to_be_bytes()[8 - width..])
            }
            // A full-object SHA was refused at CreateMultipartUpload.
            (Kind::FullObject, None) => return None,
            (Kind::Composite, _) => {
                let mut hasher = ChecksumHasher::default();
                self.algorithm.enable(&mut hasher);
                for (_, digest) in &digests {
                    hasher.update(digest);
                }
                let of_digests = hasher.finalize();
                format!("{}-{count}", self.algorithm.field(&of_digests)?)
            }
        };
        Some(ObjectChecksum { algorithm: self.algorithm, value, kind: self.kind })
    }
}

/// Checks the checksums a CompleteMultipartUpload lists for a part against the part's stored
/// ones: a listed value that differs (or one the part does not have) is `InvalidPart`.
pub(crate) fn check_listed_part(number: i32, listed: &Checksum, stored: &[(String, String)]) -> S3Result<()> {
    for algorithm in Algorithm::ALL {
        let Some(listed) = algorithm.field(listed) else { continue };
        let stored = stored.iter().find(|(name, _)| name == algorithm.header()).map(|(_, v)| v.trim());
        if stored != Some(listed.trim()) {
            return Err(S3Error::with_message(
                S3ErrorCode::InvalidPart,
                format!("The {} you specified for part {number} did not match what was uploaded", algorithm.name()),
            ));
        }
    }
    Ok(())
}
