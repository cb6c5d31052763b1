//! An OTLP trace receiver for the tests, built on the `opentelemetry-proto`
//! types: gRPC (`TraceService/Export` through tonic) and HTTP/protobuf
//! (`POST /v1/traces` through axum) on one port each. Every received span is
//! kept with its resource's `service.name`. The receiver can be stopped and
//! started again on the same port, to play a collector that goes away.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::{
    MetricsService, MetricsServiceServer,
};
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue};
use opentelemetry_proto::tonic::metrics::v1::metric::Data;
use opentelemetry_proto::tonic::metrics::v1::number_data_point;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use tokio_util::sync::CancellationToken;

/// A received span with the resource it came under.
#[derive(Clone, Debug)]
pub struct Got {
    pub service: String,
    pub resource: BTreeMap<String, String>,
    pub span: Span,
    /// `grpc` or `http`.
    pub via: &'static str,
}

impl Got {
    pub fn trace_hex(&self) -> String {
        hex(&self.span.trace_id)
    }
    pub fn span_hex(&self) -> String {
        hex(&self.span.span_id)
    }
    /// A string attribute (ints rendered in decimal).
    pub fn attr(&self, key: &str) -> Option<String> {
        attr(&self.span.attributes, key)
    }
    pub fn start_ms(&self) -> i64 {
        (self.span.start_time_unix_nano / 1_000_000) as i64
    }
    pub fn end_ms(&self) -> i64 {
        (self.span.end_time_unix_nano / 1_000_000) as i64
    }
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

pub fn attr(kvs: &[KeyValue], key: &str) -> Option<String> {
    kvs.iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .map(render)
}

fn render(v: &AnyValue) -> String {
    match &v.value {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::BoolValue(b)) => b.to_string(),
        Some(Value::DoubleValue(d)) => d.to_string(),
        other => format!("{other:?}"),
    }
}

type Store = Arc<Mutex<Vec<Got>>>;

/// One received metric point: name, unit, attributes, the value (sums and
/// gauges) or the count (histograms), and its time.
#[derive(Clone, Debug)]
pub struct Point {
    pub name: String,
    pub unit: String,
    pub attrs: BTreeMap<String, String>,
    pub value: f64,
    pub time: u64,
    pub service: String,
}

type Points = Arc<Mutex<Vec<Point>>>;

fn take_metrics(points: &Points, req: ExportMetricsServiceRequest) {
    let mut out = points.lock().expect("receiver points lock");
    for rm in req.resource_metrics {
        let service = rm
            .resource
            .as_ref()
            .and_then(|r| attr(&r.attributes, "service.name"))
            .unwrap_or_default();
        for sm in rm.scope_metrics {
            for m in sm.metrics {
                let attrs_of = |kvs: &[KeyValue]| -> BTreeMap<String, String> {
                    kvs.iter()
                        .filter_map(|kv| kv.value.as_ref().map(|v| (kv.key.clone(), render(v))))
                        .collect()
                };
                let number = |v: &Option<number_data_point::Value>| match v {
                    Some(number_data_point::Value::AsDouble(d)) => *d,
                    Some(number_data_point::Value::AsInt(i)) => *i as f64,
                    None => f64::NAN,
                };
                let mut push = |attrs, value, time| {
                    out.push(Point {
                        name: m.name.clone(),
                        unit: m.unit.clone(),
                        attrs,
                        value,
                        time,
                        service: service.clone(),
                    })
                };
                match &m.data {
                    Some(Data::Sum(s)) => s.data_points.iter().for_each(|p| {
                        push(attrs_of(&p.attributes), number(&p.value), p.time_unix_nano)
                    }),
                    Some(Data::Gauge(g)) => g.data_points.iter().for_each(|p| {
                        push(attrs_of(&p.attributes), number(&p.value), p.time_unix_nano)
                    }),
                    Some(Data::Histogram(h)) => h.data_points.iter().for_each(|p| {
                        push(attrs_of(&p.attributes), p.count as f64, p.time_unix_nano)
                    }),
                    _ => {}
                }
            }
        }
    }
}

struct GrpcMetrics(Points);

#[tonic::async_trait]
impl MetricsService for GrpcMetrics {
    async fn export(
        &self,
        request: tonic::Request<ExportMetricsServiceRequest>,
    ) -> Result<tonic::Response<ExportMetricsServiceResponse>, tonic::Status> {
        take_metrics(&self.0, request.into_inner());
        Ok(tonic::Response::new(ExportMetricsServiceResponse {
            partial_success: None,
        }))
    }
}

fn take(store: &Store, req: ExportTraceServiceRequest, via: &'static str) {
    let mut out = store.lock().expect("receiver store lock");
    for rs in req.resource_spans {
        let resource: BTreeMap<String, String> = rs
            .resource
            .map(|r| {
                r.attributes
                    .iter()
                    .filter_map(|kv| kv.value.as_ref().map(|v| (kv.key.clone(), render(v))))
                    .collect()
            })
            .unwrap_or_default();
        let service = resource.get("service.name").cloned().unwrap_or_default();
        for ss in rs.scope_spans {
            for span in ss.spans {
                out.push(Got {
                    service: service.clone(),
                    resource: resource.clone(),
                    span,
                    via,
                });
            }
        }
    }
}

/// The `x-api-key` values seen, by transport.
type Keys = Arc<Mutex<BTreeMap<&'static str, String>>>;

struct Grpc(Store, Keys);

#[tonic::async_trait]
impl TraceService for Grpc {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        if let Some(k) = request
            .metadata()
            .get("x-api-key")
            .and_then(|v| v.to_str().ok())
        {
            self.1
                .lock()
                .expect("keys lock")
                .insert("grpc", k.to_string());
        }
        take(&self.0, request.into_inner(), "grpc");
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

/// The receiver: gRPC on `grpc_port`, HTTP on `http_port`.
pub struct Receiver {
    pub grpc_port: u16,
    pub http_port: u16,
    store: Store,
    points: Points,
    keys: Keys,
    stop: Option<CancellationToken>,
    /// PEM certificate chain and key: serve TLS, gRPC and HTTP on one port.
    tls: Option<(Vec<u8>, Vec<u8>)>,
    /// PEM CA that client certificates must chain to (mutual TLS).
    client_ca: Option<Vec<u8>>,
}

impl Receiver {
    /// Starts on two free ports.
    pub async fn start() -> Receiver {
        let mut r = Receiver {
            grpc_port: super::free_port(),
            http_port: super::free_port(),
            store: Store::default(),
            points: Points::default(),
            keys: Keys::default(),
            stop: None,
            tls: None,
            client_ca: None,
        };
        r.resume().await;
        r
    }

    /// Starts with TLS (certificate chain and key in PEM) on one port that
    /// speaks both gRPC and HTTP/1.1 (`POST /v1/traces`).
    pub async fn start_tls(cert: Vec<u8>, key: Vec<u8>, client_ca: Option<Vec<u8>>) -> Receiver {
        let port = super::free_port();
        let mut r = Receiver {
            grpc_port: port,
            http_port: port,
            store: Store::default(),
            points: Points::default(),
            keys: Keys::default(),
            stop: None,
            tls: Some((cert, key)),
            client_ca,
        };
        r.resume().await;
        r
    }

    /// `http://127.0.0.1:{grpc port}`.
    pub fn grpc_endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.grpc_port)
    }

    /// `http://127.0.0.1:{http port}` (the base URL; the agent appends `/v1/traces`).
    pub fn http_endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.http_port)
    }

    /// Everything received so far.
    pub fn spans(&self) -> Vec<Got> {
        self.store.lock().expect("receiver store lock").clone()
    }

    /// The latest value of every metric series received over gRPC, by
    /// (name, attributes).
    pub fn latest_points(&self) -> BTreeMap<(String, BTreeMap<String, String>), Point> {
        let mut out: BTreeMap<(String, BTreeMap<String, String>), Point> = BTreeMap::new();
        for p in self.points.lock().expect("receiver points lock").iter() {
            let key = (p.name.clone(), p.attrs.clone());
            if out.get(&key).is_none_or(|q| q.time <= p.time) {
                out.insert(key, p.clone());
            }
        }
        out
    }

    /// The `x-api-key` header last seen over `grpc` or `http`.
    pub fn api_key(&self, via: &str) -> Option<String> {
        self.keys.lock().expect("keys lock").get(via).cloned()
    }

    pub fn len(&self) -> usize {
        self.store.lock().expect("receiver store lock").len()
    }

    /// Stops both listeners; connections are refused until [`Receiver::resume`].
    pub async fn stop(&mut self) {
        if let Some(s) = self.stop.take() {
            s.cancel();
        }
        // Let the servers drop their listeners.
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }

    /// (Re)starts both listeners on the same ports.
    pub async fn resume(&mut self) {
        if let Some((cert, key)) = self.tls.clone() {
            self.resume_tls(cert, key).await;
            return;
        }
        let stop = CancellationToken::new();
        let grpc_addr: SocketAddr = ([127, 0, 0, 1], self.grpc_port).into();
        let store = self.store.clone();
        let keys = self.keys.clone();
        let points = self.points.clone();
        let s = stop.clone();
        let listener = bind_retry(grpc_addr).await;
        tokio::spawn(async move {
            let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
            let _ = tonic::transport::Server::builder()
                .add_service(TraceServiceServer::new(Grpc(store, keys)))
                .add_service(MetricsServiceServer::new(GrpcMetrics(points)))
                .serve_with_incoming_shutdown(incoming, s.cancelled_owned())
                .await;
        });
        let http_addr: SocketAddr = ([127, 0, 0, 1], self.http_port).into();
        let store = self.store.clone();
        let keys = self.keys.clone();
        let app = axum::Router::new().route(
            "/v1/traces",
            axum::routing::post(
                move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
                    let store = store.clone();
                    let keys = keys.clone();
                    async move {
                        if let Some(k) = headers.get("x-api-key").and_then(|v| v.to_str().ok()) {
                            keys.lock()
                                .expect("keys lock")
                                .insert("http", k.to_string());
                        }
                        match ExportTraceServiceRequest::decode(body) {
                            Ok(req) => {
                                take(&store, req, "http");
                                let resp = ExportTraceServiceResponse {
                                    partial_success: None,
                                };
                                (
                                    axum::http::StatusCode::OK,
                                    [("content-type", "application/x-protobuf")],
                                    resp.encode_to_vec(),
                                )
                            }
                            Err(_) => (
                                axum::http::StatusCode::BAD_REQUEST,
                                [("content-type", "text/plain")],
                                b"not an ExportTraceServiceRequest".to_vec(),
                            ),
                        }
                    }
                },
            ),
        );
        let listener = bind_retry(http_addr).await;
        let s = stop.clone();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(s.cancelled_owned())
                .await;
        });
        self.stop = Some(stop);
    }
}

impl Receiver {
    async fn resume_tls(&mut self, cert: Vec<u8>, key: Vec<u8>) {
        let stop = CancellationToken::new();
        let addr: SocketAddr = ([127, 0, 0, 1], self.grpc_port).into();
        let store = self.store.clone();
        let http = axum::Router::new().route(
            "/v1/traces",
            axum::routing::post(move |body: axum::body::Bytes| {
                let store = store.clone();
                async move {
                    let req = ExportTraceServiceRequest::decode(body)
                        .map_err(|_| axum::http::StatusCode::BAD_REQUEST)?;
                    take(&store, req, "http");
                    Ok::<_, axum::http::StatusCode>((
                        [("content-type", "application/x-protobuf")],
                        ExportTraceServiceResponse {
                            partial_success: None,
                        }
                        .encode_to_vec(),
                    ))
                }
            }),
        );
        let routes = tonic::service::Routes::from(http).add_service(TraceServiceServer::new(Grpc(
            self.store.clone(),
            self.keys.clone(),
        )));
        let listener = bind_retry(addr).await;
        let s = stop.clone();
        let client_ca = self.client_ca.clone();
        tokio::spawn(async move {
            let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
            let mut tls = tonic::transport::ServerTlsConfig::new()
                .identity(tonic::transport::Identity::from_pem(cert, key));
            if let Some(ca) = client_ca {
                tls = tls.client_ca_root(tonic::transport::Certificate::from_pem(ca));
            }
            let result = tonic::transport::Server::builder()
                .tls_config(tls)
                .expect("the test certificate is usable")
                .accept_http1(true)
                .add_routes(routes)
                .serve_with_incoming_shutdown(incoming, s.cancelled_owned())
                .await;
            if let Err(e) = result {
                eprintln!("TLS receiver stopped: {e}");
            }
        });
        self.stop = Some(stop);
    }
}

/// A CA, a server certificate for `localhost` and 127.0.0.1 and a client
/// certificate, made with the `openssl` command in `dir`: (CA PEM path,
/// server chain PEM, server key PEM); the client's are `client.pem` and
/// `client.key` in `dir`.
pub fn test_pki(dir: &std::path::Path) -> (std::path::PathBuf, Vec<u8>, Vec<u8>) {
    let run = |args: &[&str]| {
        let out = std::process::Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("the openssl command runs");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(&[
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=inboxwatch test CA",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    ]);
    run(&[
        "req",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=localhost",
    ]);
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n\
         keyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n",
    )
    .expect("write ext.cnf");
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.pem",
        "-days",
        "2",
        "-extfile",
        "ext.cnf",
    ]);
    run(&[
        "req",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
        "-keyout",
        "client.key",
        "-out",
        "client.csr",
        "-subj",
        "/CN=inboxwatch-agent",
    ]);
    std::fs::write(
        dir.join("client.cnf"),
        "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=clientAuth\n",
    )
    .expect("write client.cnf");
    run(&[
        "x509",
        "-req",
        "-in",
        "client.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "client.pem",
        "-days",
        "2",
        "-extfile",
        "client.cnf",
    ]);
    let read = |f: &str| std::fs::read(dir.join(f)).expect("read a generated PEM");
    (dir.join("ca.pem"), read("server.pem"), read("server.key"))
}

impl Drop for Receiver {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            s.cancel();
        }
    }
}

async fn bind_retry(addr: SocketAddr) -> tokio::net::TcpListener {
    for _ in 0..100 {
        if let Ok(l) = tokio::net::TcpListener::bind(addr).await {
            return l;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("could not bind the OTLP receiver to {addr}");
}
