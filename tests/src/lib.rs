//! End-to-end tests of the fleet against real `nats-server` and `redis-server` processes (to be
//! built with the fleet worker). The local engine's end-to-end tests live in `cli/tests`.
