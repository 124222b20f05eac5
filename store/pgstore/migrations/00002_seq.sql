-- A commit sequence on the lock row: every commit takes the next number and
-- names it, with the keys it wrote, in a notification, so each replica keeps
-- a read cache that it knows to be current (cache.go).
-- +goose Up
ALTER TABLE hearth_lock ADD COLUMN IF NOT EXISTS seq BIGINT NOT NULL DEFAULT 0;

-- +goose Down
ALTER TABLE hearth_lock DROP COLUMN IF EXISTS seq;
