//! The harness itself: both servers start, answer, and are gone after drop.

use std::net::TcpStream;

#[test]
fn servers_start_answer_and_stop() {
    let redis = delta_e2e::Redis::start().expect("redis-server starts");
    let nats = delta_e2e::Nats::start().expect("nats-server starts with JetStream");
    assert!(TcpStream::connect(("127.0.0.1", redis.port)).is_ok());
    assert!(TcpStream::connect(("127.0.0.1", nats.port)).is_ok());
    let (rp, np) = (redis.port, nats.port);
    drop(redis);
    drop(nats);
    assert!(
        TcpStream::connect(("127.0.0.1", rp)).is_err(),
        "redis stopped"
    );
    assert!(
        TcpStream::connect(("127.0.0.1", np)).is_err(),
        "nats stopped"
    );
}
