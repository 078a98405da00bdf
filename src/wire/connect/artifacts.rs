//! `AddArtifacts` and `ArtifactStatus`: a client uploads files to its session (jars, Python
//! files, archives, plain files, and `cache/<sha256>` blobs such as the local relations of
//! `createDataFrame`) and asks which it already has (Spark 4.3.0 `base.proto`,
//! `AddArtifactsRequest` … `ArtifactStatusesResponse`; Spark's
//! `SparkConnectAddArtifactsHandler`, `SparkConnectArtifactStatusesHandler`).

use std::collections::HashMap;

use super::{UserContext, user_id_of};

/// `spark.connect.AddArtifactsRequest`: one message of the client stream of `AddArtifacts`
/// (connect §9.1; `SparkConnectAddArtifactsHandler.onNext`). A stream is a sequence of batches of small
/// artifacts and of chunked large ones (a `begin_chunk` then its remaining `chunk`s); the
/// server answers once, when the stream ends.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct AddArtifactsRequest {
    /// Field 1: the client's session id (a UUID string); the first message's names the
    /// session of the whole stream.
    #[prost(string, tag = "1")]
    pub session_id: String,
    /// Field 2: who uploads; with `session_id` it names the session.
    #[prost(message, optional, tag = "2")]
    pub user_context: Option<UserContext>,
    /// Field 7: the `server_side_session_id` the client saw last; a mismatch is
    /// `INVALID_HANDLE.SESSION_CHANGED` (connect §3).
    #[prost(string, optional, tag = "7")]
    pub client_observed_server_side_session_id: Option<String>,
    /// Field 6: user agent; logging only.
    #[prost(string, optional, tag = "6")]
    pub client_type: Option<String>,
    /// The `payload` oneof (fields 3, 4, 5).
    #[prost(oneof = "add_artifacts_request::Payload", tags = "3, 4, 5")]
    pub payload: Option<add_artifacts_request::Payload>,
}

impl AddArtifactsRequest {
    /// The `user_id` of [`user_context`](Self::user_context), or `""` when absent
    /// (protobuf's default, as Spark reads `getUserContext.getUserId`; connect §9.1).
    pub fn user_id(&self) -> &str {
        user_id_of(self.user_context.as_ref())
    }
}

/// Nested types of [`AddArtifactsRequest`] (connect §9.1).
pub mod add_artifacts_request {
    use bytes::Bytes;

    /// `AddArtifactsRequest.ArtifactChunk` (connect §9.1): a piece of an artifact and its CRC-32 (the
    /// IEEE polynomial of `java.util.zip.CRC32` and Python's `zlib.crc32`, as an unsigned
    /// value in an `int64`).
    #[derive(Clone, PartialEq, Eq, Hash, ::prost::Message)]
    pub struct ArtifactChunk {
        /// Field 1: the bytes.
        #[prost(bytes = "bytes", tag = "1")]
        pub data: Bytes,
        /// Field 2: the CRC-32 of `data`.
        #[prost(int64, tag = "2")]
        pub crc: i64,
    }

    impl ArtifactChunk {
        /// A chunk of `data` with its correct CRC-32, as a client sends it (connect §9.1).
        pub fn of(data: impl Into<Bytes>) -> Self {
            let data = data.into();
            let crc = i64::from(crc32fast::hash(&data));
            Self { data, crc }
        }
    }

    /// `AddArtifactsRequest.SingleChunkArtifact`: a small artifact in one chunk (connect §9.1).
    #[derive(Clone, PartialEq, Eq, Hash, ::prost::Message)]
    pub struct SingleChunkArtifact {
        /// Field 1: the artifact's name, a relative path such as `jars/a.jar` or
        /// `cache/<sha256 hex>`.
        #[prost(string, tag = "1")]
        pub name: String,
        /// Field 2: its one chunk.
        #[prost(message, optional, tag = "2")]
        pub data: Option<ArtifactChunk>,
    }

    /// `AddArtifactsRequest.Batch`: several small artifacts in one message (connect §9.1).
    #[derive(Clone, PartialEq, Eq, Hash, ::prost::Message)]
    pub struct Batch {
        /// Field 1: the artifacts.
        #[prost(message, repeated, tag = "1")]
        pub artifacts: Vec<SingleChunkArtifact>,
    }

    /// `AddArtifactsRequest.BeginChunkedArtifact` (connect §9.1): the start of a large artifact sent as
    /// `num_chunks` chunks, this one's included, of `total_bytes` bytes in all.
    #[derive(Clone, PartialEq, Eq, Hash, ::prost::Message)]
    pub struct BeginChunkedArtifact {
        /// Field 1: the artifact's name (as [`SingleChunkArtifact::name`]).
        #[prost(string, tag = "1")]
        pub name: String,
        /// Field 2: the artifact's whole size, in bytes.
        #[prost(int64, tag = "2")]
        pub total_bytes: i64,
        /// Field 3: how many chunks carry it, the initial one included.
        #[prost(int64, tag = "3")]
        pub num_chunks: i64,
        /// Field 4: the first chunk.
        #[prost(message, optional, tag = "4")]
        pub initial_chunk: Option<ArtifactChunk>,
    }

    /// The branches of [`AddArtifactsRequest::payload`](super::AddArtifactsRequest::payload)
    /// (connect §9.1).
    #[derive(Clone, PartialEq, Eq, Hash, ::prost::Oneof)]
    pub enum Payload {
        /// Field 3: whole small artifacts.
        #[prost(message, tag = "3")]
        Batch(Batch),
        /// Field 4: the start of a chunked artifact.
        #[prost(message, tag = "4")]
        BeginChunk(BeginChunkedArtifact),
        /// Field 5: a further chunk of the chunked artifact begun last.
        #[prost(message, tag = "5")]
        Chunk(ArtifactChunk),
    }
}

/// `spark.connect.AddArtifactsResponse` (connect §9.1): the one answer of `AddArtifacts`, one summary per
/// artifact of the stream, in the order they were sent
/// (`SparkConnectAddArtifactsHandler.onCompleted`).
#[derive(Clone, PartialEq, Eq, Hash, ::prost::Message)]
pub struct AddArtifactsResponse {
    /// Field 2: the session id.
    #[prost(string, tag = "2")]
    pub session_id: String,
    /// Field 3: the server-side session id (connect §3).
    #[prost(string, tag = "3")]
    pub server_side_session_id: String,
    /// Field 1: what the server saw of each artifact.
    #[prost(message, repeated, tag = "1")]
    pub artifacts: Vec<add_artifacts_response::ArtifactSummary>,
}

/// Nested types of [`AddArtifactsResponse`] (connect §9.1).
pub mod add_artifacts_response {
    /// `AddArtifactsResponse.ArtifactSummary` (connect §9.1, §9.2).
    #[derive(Clone, PartialEq, Eq, Hash, ::prost::Message)]
    pub struct ArtifactSummary {
        /// Field 1: the artifact's name, as sent.
        #[prost(string, tag = "1")]
        pub name: String,
        /// Field 2: whether every chunk's CRC matched; an artifact whose CRC failed was not
        /// kept, and the client may send it again.
        #[prost(bool, tag = "2")]
        pub is_crc_successful: bool,
    }
}

/// `spark.connect.ArtifactStatusesRequest`: which of `names` does the session have
/// (connect §9.1; `SparkConnectArtifactStatusesHandler.handle`).
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct ArtifactStatusesRequest {
    /// Field 1: the client's session id (a UUID string).
    #[prost(string, tag = "1")]
    pub session_id: String,
    /// Field 5: the `server_side_session_id` the client saw last (connect §3).
    #[prost(string, optional, tag = "5")]
    pub client_observed_server_side_session_id: Option<String>,
    /// Field 2: who asks.
    #[prost(message, optional, tag = "2")]
    pub user_context: Option<UserContext>,
    /// Field 3: user agent; logging only.
    #[prost(string, optional, tag = "3")]
    pub client_type: Option<String>,
    /// Field 4: the artifact names asked about, e.g. `cache/<sha256 hex>`.
    #[prost(string, repeated, tag = "4")]
    pub names: Vec<String>,
}

impl ArtifactStatusesRequest {
    /// The `user_id` of [`user_context`](Self::user_context), or `""` when absent
    /// (connect §9.1).
    pub fn user_id(&self) -> &str {
        user_id_of(self.user_context.as_ref())
    }
}

/// `spark.connect.ArtifactStatusesResponse`: one status per name asked (connect §9.1).
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct ArtifactStatusesResponse {
    /// Field 2: the session id.
    #[prost(string, tag = "2")]
    pub session_id: String,
    /// Field 3: the server-side session id (connect §3).
    #[prost(string, tag = "3")]
    pub server_side_session_id: String,
    /// Field 1: `map<string, ArtifactStatus>`, by name.
    #[prost(map = "string, message", tag = "1")]
    pub statuses: HashMap<String, artifact_statuses_response::ArtifactStatus>,
}

/// Nested types of [`ArtifactStatusesResponse`] (connect §9.1).
pub mod artifact_statuses_response {
    /// `ArtifactStatusesResponse.ArtifactStatus` (connect §9.1).
    #[derive(Clone, Copy, PartialEq, Eq, Hash, ::prost::Message)]
    pub struct ArtifactStatus {
        /// Field 1: whether the session has the artifact.
        #[prost(bool, tag = "1")]
        pub exists: bool,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use prost::Message;

    #[test]
    fn field_numbers_match_base_proto() {
        let req = AddArtifactsRequest {
            session_id: "s".into(),
            client_observed_server_side_session_id: Some("o".into()),
            client_type: Some("t".into()),
            payload: Some(add_artifacts_request::Payload::Chunk(
                add_artifacts_request::ArtifactChunk {
                    data: Bytes::from_static(b"a"),
                    crc: 5,
                },
            )),
            ..Default::default()
        };
        let buf = req.encode_to_vec();
        assert!(buf.windows(3).any(|w| w == [0x0a, 1, b's']));
        assert!(buf.windows(3).any(|w| w == [0x3a, 1, b'o']));
        assert!(buf.windows(3).any(|w| w == [0x32, 1, b't']));
        // chunk: field 5 { data: field 1 "a", crc: field 2 = 5 }
        assert!(
            buf.windows(7)
                .any(|w| w == [0x2a, 5, 0x0a, 1, b'a', 0x10, 5])
        );
        assert_eq!(AddArtifactsRequest::decode(buf.as_slice()).unwrap(), req);

        let begin = add_artifacts_request::BeginChunkedArtifact {
            name: "n".into(),
            total_bytes: 2,
            num_chunks: 3,
            initial_chunk: Some(add_artifacts_request::ArtifactChunk::default()),
        };
        assert_eq!(
            begin.encode_to_vec(),
            vec![0x0a, 1, b'n', 0x10, 2, 0x18, 3, 0x22, 0]
        );
        let summary = add_artifacts_response::ArtifactSummary {
            name: "n".into(),
            is_crc_successful: true,
        };
        assert_eq!(summary.encode_to_vec(), vec![0x0a, 1, b'n', 0x10, 1]);
        let status = ArtifactStatusesRequest {
            names: vec!["c".into()],
            client_observed_server_side_session_id: Some("o".into()),
            ..Default::default()
        };
        let buf = status.encode_to_vec();
        assert!(buf.windows(3).any(|w| w == [0x22, 1, b'c']));
        assert!(buf.windows(3).any(|w| w == [0x2a, 1, b'o']));
    }

    #[test]
    fn a_chunk_carries_zlib_s_crc32() {
        // zlib.crc32(b"hello artifact") as Python computes it.
        let chunk = add_artifacts_request::ArtifactChunk::of(&b"hello artifact"[..]);
        assert_eq!(chunk.crc, 2_242_889_464);
    }
}
