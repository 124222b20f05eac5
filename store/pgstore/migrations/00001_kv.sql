-- The control plane's records, as the embedded store keeps them: JSON
-- values under keys that order bytewise (BYTEA compares bytewise in
-- PostgreSQL and CockroachDB alike).
-- +goose Up
CREATE TABLE IF NOT EXISTS hearth_kv (
    k BYTEA PRIMARY KEY,
    v BYTEA NOT NULL
);

-- One row that writers lock (SELECT … FOR UPDATE) for the length of their
-- change, so every replica's changes are serialised.
CREATE TABLE IF NOT EXISTS hearth_lock (
    id INT PRIMARY KEY
);
INSERT INTO hearth_lock (id) VALUES (1) ON CONFLICT (id) DO NOTHING;

-- +goose Down
DROP TABLE IF EXISTS hearth_lock;
DROP TABLE IF EXISTS hearth_kv;
