-- idemgate's dedupe table on PostgreSQL, created when missing (src/store/sql/postgres.rs
-- runs this under an advisory lock, `{t}` replaced by the configured table name). One row
-- per key; every time is the database's (now()), never a replica's.
-- A function whose meaning changes gets a new version suffix (`_v2`): CREATE OR REPLACE
-- would otherwise let replicas of two versions overwrite each other's on every start
-- while a deploy rolls.
CREATE TABLE IF NOT EXISTS {t} (
    digest      bytea PRIMARY KEY,          -- SHA-256 of the key: never a raw key
    kind        "char" NOT NULL,            -- I in flight, D done, N not stored, U unknown, F failed, T issued
    token       bytea,                      -- the owner whose claim wrote the record (fencing)
    fingerprint bytea NOT NULL,             -- the payload fingerprint of the claim
    created_at  timestamptz NOT NULL,       -- claim or settlement time
    lease_until timestamptz,                -- in flight: the lease runs out (renewals move it)
    expires_at  timestamptz NOT NULL,       -- the record is gone (in flight: lease + lapse span)
    lapse_hold  boolean NOT NULL DEFAULT false,  -- in flight: a lapse is held as unknown
    waited      boolean NOT NULL DEFAULT false,  -- in flight: a duplicate waits (settle notifies)
    issued      boolean NOT NULL DEFAULT false,  -- failed: a one-time token's, reissued;
                                                 -- in flight: observe mode counted it
    status      smallint,                   -- not stored: the upstream's status
    response    bytea                       -- done, failed: the stored answer
);
CREATE INDEX IF NOT EXISTS {t}_expires ON {t} (expires_at);
CREATE TABLE IF NOT EXISTS {t}_hits (
    digest     bytea PRIMARY KEY,
    window_end timestamptz NOT NULL,
    hits       bigint NOT NULL
);
CREATE INDEX IF NOT EXISTS {t}_hits_expires ON {t}_hits (window_end);
-- How often a key was seen on a route in observe mode, for as long as its record lives:
-- a count stands while its expires_at is its record's. The count routine sets it so and
-- marks a claim in flight it counts (`issued`), whose renewals and settlement then move
-- the count's expiry with the record's; a record written afresh (a new claim, a write-back)
-- has another expires_at, so an older count no longer stands and counting starts again.
CREATE TABLE IF NOT EXISTS {t}_seen (
    digest     bytea PRIMARY KEY,
    times      bigint NOT NULL,
    last_at    timestamptz NOT NULL,
    expires_at timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS {t}_seen_expires ON {t}_seen (expires_at);

-- Claims a key in one call: takes a free key (unless only an issued one may be, or the
-- caller is a waiter that may not take a turn of its own), an issued token, or a failure
-- left for another owner's waiters; with p_mark, marks another owner's in-flight record as
-- waited on. Each statement in a READ COMMITTED function sees what committed before it,
-- so a row another claimer inserted after this call's look is seen by the next look: the
-- loop looks again whenever a write found the row changed under it. Returns outcome 0
-- (owned), 1 (free and not taken) or 2 (the record, as found).
CREATE OR REPLACE FUNCTION {t}_claim_v1(
    p_digest bytea, p_token bytea, p_fp bytea, p_lease_ms bigint, p_span_ms bigint,
    p_hold boolean, p_issued_only boolean, p_waiter boolean, p_mark boolean)
RETURNS TABLE (outcome smallint, kind "char", token bytea, fingerprint bytea,
    status smallint, response bytea, issued boolean, lapse_hold boolean,
    lease_ms bigint, expires_ms bigint, created_ms bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    r {t}%ROWTYPE;
    take_free boolean := NOT p_issued_only AND (NOT p_waiter OR NOT p_hold);
    v_lease timestamptz := now() + p_lease_ms * interval '1 millisecond';
    v_expires timestamptz := now() + (p_lease_ms + p_span_ms) * interval '1 millisecond';
BEGIN
    FOR attempt IN 1..20 LOOP
        SELECT * INTO r FROM {t} t WHERE t.digest = p_digest;
        IF NOT FOUND OR r.expires_at <= now() THEN
            IF NOT take_free THEN
                RETURN QUERY SELECT 1::smallint, NULL::"char", NULL::bytea, NULL::bytea,
                    NULL::smallint, NULL::bytea, false, false, 0::bigint, 0::bigint,
                    0::bigint;
                RETURN;
            END IF;
            IF r.digest IS NULL THEN
                INSERT INTO {t} (digest, kind, token, fingerprint, created_at, lease_until,
                                 expires_at, lapse_hold)
                VALUES (p_digest, 'I', p_token, p_fp, now(), v_lease, v_expires, p_hold)
                ON CONFLICT DO NOTHING;
            ELSE
                UPDATE {t} t SET kind = 'I', token = p_token, fingerprint = p_fp,
                    created_at = now(), lease_until = v_lease, expires_at = v_expires,
                    lapse_hold = p_hold, waited = false, issued = false, status = NULL,
                    response = NULL
                WHERE t.digest = p_digest AND t.expires_at <= now();
            END IF;
        ELSIF r.kind = 'I' AND r.token = p_token THEN
            -- A retried claim whose first answer was lost: the key is this claim's.
            FOUND := true;
        ELSIF NOT p_waiter AND (r.kind = 'T'
                OR (r.kind = 'F' AND (NOT p_issued_only OR r.issued))) THEN
            UPDATE {t} t SET kind = 'I', token = p_token, fingerprint = p_fp,
                created_at = now(), lease_until = v_lease, expires_at = v_expires,
                lapse_hold = p_hold, waited = false, issued = false, status = NULL,
                response = NULL
            WHERE t.digest = p_digest AND t.kind = r.kind
                AND t.token IS NOT DISTINCT FROM r.token AND t.expires_at > now();
        ELSE
            IF p_mark AND r.kind = 'I' AND NOT r.waited THEN
                UPDATE {t} t SET waited = true
                WHERE t.digest = p_digest AND t.kind = 'I' AND t.token = r.token
                    AND t.expires_at > now();
                -- The row changed between the look and the mark: look again.
                CONTINUE WHEN NOT FOUND;
            END IF;
            RETURN QUERY SELECT 2::smallint, r.kind, r.token, r.fingerprint, r.status,
                r.response, r.issued, r.lapse_hold,
                (extract(epoch FROM r.lease_until - now()) * 1000)::bigint,
                (extract(epoch FROM r.expires_at - now()) * 1000)::bigint,
                (extract(epoch FROM r.created_at) * 1000)::bigint;
            RETURN;
        END IF;
        IF FOUND THEN
            RETURN QUERY SELECT 0::smallint, NULL::"char", NULL::bytea, NULL::bytea,
                NULL::smallint, NULL::bytea, false, false, 0::bigint, 0::bigint, 0::bigint;
            RETURN;
        END IF;
        -- The row changed between the look and the write: look again.
    END LOOP;
    RAISE EXCEPTION 'idemgate: the claim of a key kept racing';
END $$;

-- Ends a claim: fenced by the owner token (its in-flight record, or its own unknown
-- outcome, which a late answer may still settle), writing the settlement (p_kind NULL:
-- deleting the row) and notifying the waiters if one marked the record. What observe mode
-- counted of the claim (it marked the claim; an unknown outcome is looked up) lives as long
-- as the settlement, or goes with the row. A record that is gone is written back when
-- p_writes_back says the request ran. Returns 1 (settled, or gone and nothing to write),
-- 2 (written back) or 0 (another owner's record).
-- v2: carries observe mode's count over to the settlement.
CREATE OR REPLACE FUNCTION {t}_settle_v2(
    p_digest bytea, p_token bytea, p_fp bytea, p_kind "char", p_ttl_ms bigint,
    p_status smallint, p_response bytea, p_issued boolean, p_writes_back boolean)
RETURNS smallint
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    r record;
    v_expires timestamptz := now() + p_ttl_ms * interval '1 millisecond';
BEGIN
    FOR attempt IN 1..20 LOOP
        SELECT t.kind, t.token, t.waited, t.issued, t.expires_at INTO r
        FROM {t} t WHERE t.digest = p_digest FOR UPDATE;
        IF FOUND AND r.token = p_token AND r.kind IN ('I', 'U') THEN
            IF p_kind IS NULL THEN
                DELETE FROM {t} t WHERE t.digest = p_digest;
            ELSE
                UPDATE {t} t SET kind = p_kind, fingerprint = p_fp, created_at = now(),
                    lease_until = NULL, expires_at = v_expires, issued = p_issued,
                    status = p_status, response = p_response
                WHERE t.digest = p_digest;
            END IF;
            IF r.issued OR r.kind = 'U' THEN
                IF p_kind IS NULL THEN
                    DELETE FROM {t}_seen s WHERE s.digest = p_digest;
                ELSE
                    UPDATE {t}_seen s SET expires_at = v_expires
                    WHERE s.digest = p_digest AND s.expires_at = r.expires_at;
                END IF;
            END IF;
            IF r.waited THEN
                PERFORM pg_notify('{t}_done', encode(p_digest, 'hex'));
            END IF;
            RETURN 1;
        END IF;
        IF FOUND AND r.expires_at > now() THEN
            -- This owner's settlement, sent again after a lost answer; or another's record.
            RETURN CASE WHEN r.token = p_token THEN 1 ELSE 0 END;
        END IF;
        IF NOT p_writes_back OR p_kind IS NULL THEN
            RETURN 1;
        END IF;
        IF FOUND THEN
            UPDATE {t} t SET kind = p_kind, token = p_token, fingerprint = p_fp,
                created_at = now(), lease_until = NULL, expires_at = v_expires,
                lapse_hold = false, waited = false, issued = p_issued, status = p_status,
                response = p_response
            WHERE t.digest = p_digest;
            RETURN 2;
        END IF;
        INSERT INTO {t} (digest, kind, token, fingerprint, created_at, expires_at, issued,
                         status, response)
        VALUES (p_digest, p_kind, p_token, p_fp, now(), v_expires, p_issued, p_status,
                p_response)
        ON CONFLICT DO NOTHING;
        IF FOUND THEN
            RETURN 2;
        END IF;
        -- Claimed by someone else since the look: look again.
    END LOOP;
    RAISE EXCEPTION 'idemgate: the settlement of a key kept racing';
END $$;

-- Renews a live claim for its lease from now, or writes it back if its record is gone (an
-- operator's purge), so duplicates keep finding it in flight; what observe mode counted of
-- the claim is renewed with it. Returns 1 (renewed), 2 (restored) or 0 (another's record:
-- the claim is lost).
-- v2: renews observe mode's count too.
CREATE OR REPLACE FUNCTION {t}_renew_v2(
    p_digest bytea, p_token bytea, p_fp bytea, p_lease_ms bigint, p_span_ms bigint,
    p_hold boolean)
RETURNS smallint
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    r record;
    v_lease timestamptz := now() + p_lease_ms * interval '1 millisecond';
    v_expires timestamptz := now() + (p_lease_ms + p_span_ms) * interval '1 millisecond';
BEGIN
    FOR attempt IN 1..20 LOOP
        SELECT t.kind, t.token, t.issued, t.expires_at INTO r
        FROM {t} t WHERE t.digest = p_digest FOR UPDATE;
        IF FOUND AND r.kind = 'I' AND r.token = p_token THEN
            UPDATE {t} t SET lease_until = v_lease, expires_at = v_expires
            WHERE t.digest = p_digest;
            IF r.issued THEN
                UPDATE {t}_seen s SET expires_at = v_expires
                WHERE s.digest = p_digest AND s.expires_at = r.expires_at;
            END IF;
            RETURN 1;
        END IF;
        IF FOUND AND r.expires_at > now() THEN
            RETURN 0;
        END IF;
        IF FOUND THEN
            UPDATE {t} t SET kind = 'I', token = p_token, fingerprint = p_fp,
                created_at = now(), lease_until = v_lease, expires_at = v_expires,
                lapse_hold = p_hold, waited = false, issued = false, status = NULL,
                response = NULL
            WHERE t.digest = p_digest;
            RETURN 2;
        END IF;
        INSERT INTO {t} (digest, kind, token, fingerprint, created_at, lease_until,
                         expires_at, lapse_hold)
        VALUES (p_digest, 'I', p_token, p_fp, now(), v_lease, v_expires, p_hold)
        ON CONFLICT DO NOTHING;
        IF FOUND THEN
            RETURN 2;
        END IF;
    END LOOP;
    RAISE EXCEPTION 'idemgate: the renewal of a key kept racing';
END $$;

-- An operator's purge: deletes a key's record and its observe-mode count and notifies its
-- waiters, unless the record is a claim in flight (its lease runs, or it lapsed on a route
-- that releases lapsed claims, whose takeover waits for the row to expire), or, with
-- p_state, another record than the one the operator looked at: the state shown (a lapsed
-- claim held as unknown shows as 'U'), the claim's token and created_at in ms, as the
-- inspection reads them. A lapsed claim held as unknown is an unknown outcome and is
-- deleted. The look locks the row, so no claim can take the key between the decision and
-- the delete. Returns 1 (deleted), 2 (a claim in flight, left alone), 3 (another record,
-- left alone) or 0 (no live record).
-- v2: deletes only the record named, when one is.
CREATE OR REPLACE FUNCTION {t}_purge_v2(
    p_digest bytea, p_state "char", p_token bytea, p_created_ms bigint)
RETURNS smallint
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    r record;
BEGIN
    SELECT t.kind, t.token, t.created_at, t.lease_until, t.lapse_hold INTO r
    FROM {t} t WHERE t.digest = p_digest AND t.expires_at > now() FOR UPDATE;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    IF r.kind = 'I' AND (r.lease_until > now() OR NOT r.lapse_hold) THEN
        RETURN 2;
    END IF;
    IF p_state IS NOT NULL AND (
            CASE WHEN r.kind = 'I' THEN 'U'::"char" ELSE r.kind END <> p_state
            OR r.token IS DISTINCT FROM p_token
            OR (extract(epoch FROM r.created_at) * 1000)::bigint <> p_created_ms) THEN
        RETURN 3;
    END IF;
    DELETE FROM {t} t WHERE t.digest = p_digest;
    DELETE FROM {t}_seen s WHERE s.digest = p_digest;
    PERFORM pg_notify('{t}_done', encode(p_digest, 'hex'));
    RETURN 1;
END $$;

-- Counts a duplicate seen in observe mode while the key has a record (the first request
-- counts as one), and marks a claim in flight as counted so that its renewals and its
-- settlement keep the count. The row is locked first: a settlement running meanwhile
-- either comes after (and finds the mark and the count) or before (and the count takes
-- the settlement's expiry). Returns when the record was made (Unix ms; NULL for no record,
-- or an issued token, which has no request yet).
CREATE OR REPLACE FUNCTION {t}_seen_v1(p_digest bytea)
RETURNS bigint
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    r record;
BEGIN
    SELECT t.kind, t.issued, t.created_at, t.expires_at INTO r
    FROM {t} t WHERE t.digest = p_digest AND t.expires_at > now() FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF r.kind = 'I' AND NOT r.issued THEN
        UPDATE {t} t SET issued = true WHERE t.digest = p_digest;
    END IF;
    INSERT INTO {t}_seen AS s (digest, times, last_at, expires_at)
    VALUES (p_digest, 2, now(), r.expires_at)
    ON CONFLICT (digest) DO UPDATE SET
        times = CASE WHEN s.expires_at = EXCLUDED.expires_at THEN s.times + 1 ELSE 2 END,
        last_at = now(), expires_at = EXCLUDED.expires_at;
    IF r.kind = 'T' THEN
        RETURN NULL;
    END IF;
    RETURN (extract(epoch FROM r.created_at) * 1000)::bigint;
END $$;
