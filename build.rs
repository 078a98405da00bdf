//! Generates the gRPC glue of Spark Connect's `SparkConnectService` when the `spark-connect`
//! feature is on: tonic's server and client code for the RPCs tether serves, over the
//! hand-written prost messages of `wire::connect`. No `.proto` file is read (tonic-build's
//! `manual` mode); the method names and paths are Spark's (`spark.connect` package).

fn main() {
    #[cfg(feature = "spark-connect")]
    spark_connect::generate();
}

#[cfg(feature = "spark-connect")]
mod spark_connect {
    use tonic_build::manual::{Builder, Method, Service};

    /// `(rust name, route name, request, response, server streaming)`.
    const METHODS: &[(&str, &str, &str, &str, bool)] = &[
        (
            "execute_plan",
            "ExecutePlan",
            "ExecutePlanRequest",
            "ExecutePlanResponse",
            true,
        ),
        (
            "analyze_plan",
            "AnalyzePlan",
            "AnalyzePlanRequest",
            "AnalyzePlanResponse",
            false,
        ),
        ("config", "Config", "ConfigRequest", "ConfigResponse", false),
        (
            "interrupt",
            "Interrupt",
            "InterruptRequest",
            "InterruptResponse",
            false,
        ),
        (
            "reattach_execute",
            "ReattachExecute",
            "ReattachExecuteRequest",
            "ExecutePlanResponse",
            true,
        ),
        (
            "release_execute",
            "ReleaseExecute",
            "ReleaseExecuteRequest",
            "ReleaseExecuteResponse",
            false,
        ),
        (
            "add_artifacts",
            "AddArtifacts",
            "AddArtifactsRequest",
            "AddArtifactsResponse",
            false,
        ),
        (
            "artifact_status",
            "ArtifactStatus",
            "ArtifactStatusesRequest",
            "ArtifactStatusesResponse",
            false,
        ),
        (
            "release_session",
            "ReleaseSession",
            "ReleaseSessionRequest",
            "ReleaseSessionResponse",
            false,
        ),
        (
            "fetch_error_details",
            "FetchErrorDetails",
            "FetchErrorDetailsRequest",
            "FetchErrorDetailsResponse",
            false,
        ),
        (
            "clone_session",
            "CloneSession",
            "CloneSessionRequest",
            "CloneSessionResponse",
            false,
        ),
        (
            "get_status",
            "GetStatus",
            "GetStatusRequest",
            "GetStatusResponse",
            false,
        ),
    ];

    /// The methods of `METHODS` whose requests are a client stream (`AddArtifacts`).
    const CLIENT_STREAMING: &[&str] = &["add_artifacts"];

    pub(super) fn generate() {
        let mut service = Service::builder()
            .name("SparkConnectService")
            .package("spark.connect");
        for &(name, route, input, output, streaming) in METHODS {
            let mut method = Method::builder()
                .name(name)
                .route_name(route)
                .input_type(format!("crate::wire::connect::{input}"))
                .output_type(format!("crate::wire::connect::{output}"))
                .codec_path("tonic_prost::ProstCodec");
            if streaming {
                method = method.server_streaming();
            }
            if CLIENT_STREAMING.contains(&name) {
                method = method.client_streaming();
            }
            service = service.method(method.build());
        }
        Builder::new().compile(&[service.build()]);
    }
}
