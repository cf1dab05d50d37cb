//! A deliberately non-idempotent "legacy" app to put idemgate in front of:
//! every `POST /orders` creates a new order, `GET /orders` lists them.
//!
//! ```text
//! cargo run --example legacy_orders            # listens on 127.0.0.1:3000
//! cargo run --example legacy_orders -- 127.0.0.1:4000
//! ```

use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;

#[derive(Default)]
struct Orders {
    list: Vec<serde_json::Value>,
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:3000".into());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!("legacy_orders listening on http://{addr} (POST /orders creates, GET /orders lists)");
    let orders = Arc::new(Mutex::new(Orders::default()));
    loop {
        let (stream, _) = listener.accept().await?;
        let orders = Arc::clone(&orders);
        tokio::spawn(async move {
            let service = service_fn(move |req| handle(req, Arc::clone(&orders)));
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn handle(
    req: Request<Incoming>,
    orders: Arc<Mutex<Orders>>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let (status, json) = match (method, path.as_str()) {
        (Method::POST, "/orders") => {
            let item: serde_json::Value =
                serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
            let mut orders = orders.lock().expect("orders lock");
            let order = serde_json::json!({ "id": orders.list.len() + 1, "item": item });
            orders.list.push(order.clone());
            println!("created order {}", order["id"]);
            (StatusCode::CREATED, order)
        }
        (Method::GET, "/orders") => {
            let orders = orders.lock().expect("orders lock");
            (StatusCode::OK, serde_json::json!(orders.list))
        }
        _ => (
            StatusCode::NOT_FOUND,
            serde_json::json!({ "error": "not found" }),
        ),
    };
    let mut response = Response::new(Full::new(Bytes::from(json.to_string())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    Ok(response)
}
