-- idemgate's dedupe table on MySQL 8 / MariaDB 10.5+, created when missing
-- (src/store/sql/mysql.rs sends each statement between the `-- ;;` lines on its own,
-- `{t}` replaced by the configured table name; every statement is IF NOT EXISTS, so
-- replicas starting together leave one schema). One row per key; every time is the
-- database's (UTC_TIMESTAMP), never a replica's.
-- A routine whose meaning changes gets a new version suffix (`_v2`): procedures are
-- created only when missing, and replicas of two versions share one database while a
-- deploy rolls.
CREATE TABLE IF NOT EXISTS {t} (
    digest      BINARY(32) NOT NULL PRIMARY KEY,   -- SHA-256 of the key: never a raw key
    kind        CHAR(1) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
                                                   -- I in flight, D done, N not stored,
                                                   -- U unknown, F failed, T issued
    token       BINARY(16) NULL,                   -- the owner that wrote it (fencing)
    fingerprint BINARY(32) NOT NULL,               -- the claim's payload fingerprint
    created_at  DATETIME(3) NOT NULL,              -- claim or settlement time
    lease_until DATETIME(3) NULL,                  -- in flight: the lease runs out
    expires_at  DATETIME(3) NOT NULL,              -- gone (in flight: lease + lapse span)
    lapse_hold  BOOLEAN NOT NULL DEFAULT FALSE,    -- in flight: a lapse is held as unknown
    issued      BOOLEAN NOT NULL DEFAULT FALSE,    -- failed: a one-time token's, reissued;
                                                   -- in flight: observe mode counted it
    status      SMALLINT NULL,                     -- not stored: the upstream's status
    response    LONGBLOB NULL,                     -- done, failed: the stored answer
    KEY {t}_expires (expires_at)
) ENGINE = InnoDB
-- ;;
CREATE TABLE IF NOT EXISTS {t}_hits (
    digest     BINARY(32) NOT NULL PRIMARY KEY,
    window_end DATETIME(3) NOT NULL,
    hits       BIGINT NOT NULL,
    KEY {t}_hits_expires (window_end)
) ENGINE = InnoDB
-- ;;
-- How often a key was seen on a route in observe mode, for as long as its record lives:
-- a count stands while its expires_at is its record's. The count routine sets it so and
-- marks a claim in flight it counts (`issued`), whose renewals and settlement then move
-- the count's expiry with the record's; a record written afresh (a new claim, a write-back)
-- has another expires_at, so an older count no longer stands and counting starts again.
CREATE TABLE IF NOT EXISTS {t}_seen (
    digest     BINARY(32) NOT NULL PRIMARY KEY,
    times      BIGINT NOT NULL,
    last_at    DATETIME(3) NOT NULL,
    expires_at DATETIME(3) NOT NULL,
    KEY {t}_seen_expires (expires_at)
) ENGINE = InnoDB
-- ;;
-- Claims a key in one call: takes a free key (unless only an issued one may be, or the
-- caller is a waiter that may not take a turn of its own), an issued token, or a failure
-- left for another owner's waiters. Each statement here runs in its own transaction and
-- reads what committed before it; a write checks that the row is still what the look
-- found, and the loop looks again when it is not. Returns one row: outcome 0 (owned),
-- 1 (free and not taken) or 2 (the record, as found).
CREATE PROCEDURE IF NOT EXISTS {t}_claim_v1(
    IN p_digest BINARY(32), IN p_token BINARY(16), IN p_fp BINARY(32),
    IN p_lease_ms BIGINT, IN p_span_ms BIGINT, IN p_hold BOOLEAN,
    IN p_issued_only BOOLEAN, IN p_waiter BOOLEAN)
BEGIN
    DECLARE v_now DATETIME(3) DEFAULT UTC_TIMESTAMP(3);
    DECLARE v_lease DATETIME(3) DEFAULT v_now + INTERVAL p_lease_ms * 1000 MICROSECOND;
    DECLARE v_expires DATETIME(3)
        DEFAULT v_now + INTERVAL (p_lease_ms + p_span_ms) * 1000 MICROSECOND;
    DECLARE v_take_free BOOLEAN DEFAULT NOT p_issued_only AND (NOT p_waiter OR NOT p_hold);
    DECLARE v_attempt INT DEFAULT 0;
    DECLARE v_found BOOLEAN;
    DECLARE r_kind CHAR(1) CHARACTER SET ascii;
    DECLARE r_token BINARY(16);
    DECLARE r_fp BINARY(32);
    DECLARE r_created DATETIME(3);
    DECLARE r_lease DATETIME(3);
    DECLARE r_expires DATETIME(3);
    DECLARE r_hold BOOLEAN;
    DECLARE r_issued BOOLEAN;
    DECLARE r_status SMALLINT;
    DECLARE r_response LONGBLOB;
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_found = FALSE;
    look: LOOP
        SET v_attempt = v_attempt + 1;
        IF v_attempt > 20 THEN
            SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'idemgate: the claim of a key kept racing';
        END IF;
        SET v_found = TRUE;
        SELECT kind, token, fingerprint, created_at, lease_until, expires_at, lapse_hold,
               issued, status, response
          INTO r_kind, r_token, r_fp, r_created, r_lease, r_expires, r_hold, r_issued,
               r_status, r_response
          FROM {t} WHERE digest = p_digest;
        IF NOT v_found OR r_expires <= v_now THEN
            IF NOT v_take_free THEN
                SELECT 1 AS outcome;
                LEAVE look;
            END IF;
            IF NOT v_found THEN
                INSERT IGNORE INTO {t} (digest, kind, token, fingerprint, created_at,
                                        lease_until, expires_at, lapse_hold)
                VALUES (p_digest, 'I', p_token, p_fp, v_now, v_lease, v_expires, p_hold);
            ELSE
                UPDATE {t} SET kind = 'I', token = p_token, fingerprint = p_fp,
                    created_at = v_now, lease_until = v_lease, expires_at = v_expires,
                    lapse_hold = p_hold, issued = FALSE, status = NULL, response = NULL
                WHERE digest = p_digest AND expires_at <= v_now;
            END IF;
        ELSEIF r_kind = 'I' AND r_token = p_token THEN
            -- A retried claim whose first answer was lost: the key is this claim's.
            SELECT 0 AS outcome;
            LEAVE look;
        ELSEIF NOT p_waiter AND (r_kind = 'T'
                OR (r_kind = 'F' AND (NOT p_issued_only OR r_issued))) THEN
            UPDATE {t} SET kind = 'I', token = p_token, fingerprint = p_fp,
                created_at = v_now, lease_until = v_lease, expires_at = v_expires,
                lapse_hold = p_hold, issued = FALSE, status = NULL, response = NULL
            WHERE digest = p_digest AND kind = r_kind AND token <=> r_token
                AND expires_at > v_now;
        ELSE
            SELECT 2 AS outcome, r_kind AS kind, r_token AS token, r_fp AS fingerprint,
                r_status AS status, r_response AS response, r_issued AS issued,
                r_hold AS lapse_hold,
                CAST(TIMESTAMPDIFF(MICROSECOND, v_now, r_lease) DIV 1000 AS SIGNED) AS lease_ms,
                CAST(TIMESTAMPDIFF(MICROSECOND, v_now, r_expires) DIV 1000 AS SIGNED) AS expires_ms,
                CAST(TIMESTAMPDIFF(MICROSECOND, '1970-01-01', r_created) DIV 1000 AS SIGNED)
                    AS created_ms;
            LEAVE look;
        END IF;
        IF ROW_COUNT() = 1 THEN
            SELECT 0 AS outcome;
            LEAVE look;
        END IF;
        -- The row changed between the look and the write: look again.
    END LOOP;
END
-- ;;
-- Ends a claim: fenced by the owner token (its in-flight record, or its own unknown
-- outcome, which a late answer may still settle), writing the settlement (p_kind NULL:
-- deleting the row). What observe mode counted of the claim (it marked the claim; an
-- unknown outcome is looked up) lives as long as the settlement, or goes with the row. A
-- record that is gone is written back when p_writes_back says the request ran. Returns 1
-- (settled, or gone and nothing to write), 2 (written back) or 0 (another owner's record).
-- v2: carries observe mode's count over to the settlement.
CREATE PROCEDURE IF NOT EXISTS {t}_settle_v2(
    IN p_digest BINARY(32), IN p_token BINARY(16), IN p_fp BINARY(32), IN p_kind CHAR(1),
    IN p_ttl_ms BIGINT, IN p_status SMALLINT, IN p_response LONGBLOB, IN p_issued BOOLEAN,
    IN p_writes_back BOOLEAN)
BEGIN
    DECLARE v_now DATETIME(3) DEFAULT UTC_TIMESTAMP(3);
    DECLARE v_expires DATETIME(3) DEFAULT v_now + INTERVAL p_ttl_ms * 1000 MICROSECOND;
    DECLARE v_attempt INT DEFAULT 0;
    DECLARE v_found BOOLEAN;
    DECLARE v_code INT;
    DECLARE r_kind CHAR(1) CHARACTER SET ascii;
    DECLARE r_token BINARY(16);
    DECLARE r_expires DATETIME(3);
    DECLARE r_counted BOOLEAN;
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_found = FALSE;
    DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
    settle: LOOP
        SET v_attempt = v_attempt + 1;
        IF v_attempt > 20 THEN
            SIGNAL SQLSTATE '45000'
                SET MESSAGE_TEXT = 'idemgate: the settlement of a key kept racing';
        END IF;
        SET v_found = TRUE, v_code = NULL;
        START TRANSACTION;
        SELECT kind, token, expires_at, issued OR kind = 'U'
          INTO r_kind, r_token, r_expires, r_counted
          FROM {t} WHERE digest = p_digest FOR UPDATE;
        IF v_found AND r_token = p_token AND r_kind IN ('I', 'U') THEN
            IF p_kind IS NULL THEN
                DELETE FROM {t} WHERE digest = p_digest;
            ELSE
                UPDATE {t} SET kind = p_kind, fingerprint = p_fp, created_at = v_now,
                    lease_until = NULL, expires_at = v_expires, issued = p_issued,
                    status = p_status, response = p_response
                WHERE digest = p_digest;
            END IF;
            IF r_counted AND p_kind IS NULL THEN
                DELETE FROM {t}_seen WHERE digest = p_digest;
            ELSEIF r_counted THEN
                UPDATE {t}_seen SET expires_at = v_expires
                WHERE digest = p_digest AND expires_at = r_expires;
            END IF;
            SET v_code = 1;
        ELSEIF v_found AND r_expires > v_now THEN
            -- This owner's settlement, sent again after a lost answer; or another's record.
            SET v_code = IF(r_token <=> p_token, 1, 0);
        ELSEIF NOT p_writes_back OR p_kind IS NULL THEN
            SET v_code = 1;
        ELSEIF v_found THEN
            UPDATE {t} SET kind = p_kind, token = p_token, fingerprint = p_fp,
                created_at = v_now, lease_until = NULL, expires_at = v_expires,
                lapse_hold = FALSE, issued = p_issued, status = p_status,
                response = p_response
            WHERE digest = p_digest;
            SET v_code = 2;
        ELSE
            INSERT IGNORE INTO {t} (digest, kind, token, fingerprint, created_at,
                                    expires_at, issued, status, response)
            VALUES (p_digest, p_kind, p_token, p_fp, v_now, v_expires, p_issued, p_status,
                    p_response);
            IF ROW_COUNT() = 1 THEN
                SET v_code = 2;
            END IF;
        END IF;
        COMMIT;
        IF v_code IS NOT NULL THEN
            SELECT v_code AS code;
            LEAVE settle;
        END IF;
        -- Claimed by someone else since the look: look again.
    END LOOP;
END
-- ;;
-- Renews a live claim for its lease from now, or writes it back if its record is gone (an
-- operator's purge); what observe mode counted of the claim is renewed with it. Returns 1
-- (renewed), 2 (restored) or 0 (another's record: lost).
-- v2: renews observe mode's count too.
CREATE PROCEDURE IF NOT EXISTS {t}_renew_v2(
    IN p_digest BINARY(32), IN p_token BINARY(16), IN p_fp BINARY(32),
    IN p_lease_ms BIGINT, IN p_span_ms BIGINT, IN p_hold BOOLEAN)
BEGIN
    DECLARE v_now DATETIME(3) DEFAULT UTC_TIMESTAMP(3);
    DECLARE v_lease DATETIME(3) DEFAULT v_now + INTERVAL p_lease_ms * 1000 MICROSECOND;
    DECLARE v_expires DATETIME(3)
        DEFAULT v_now + INTERVAL (p_lease_ms + p_span_ms) * 1000 MICROSECOND;
    DECLARE v_attempt INT DEFAULT 0;
    DECLARE v_found BOOLEAN;
    DECLARE v_code INT;
    DECLARE r_kind CHAR(1) CHARACTER SET ascii;
    DECLARE r_token BINARY(16);
    DECLARE r_expires DATETIME(3);
    DECLARE r_counted BOOLEAN;
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_found = FALSE;
    DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
    renew: LOOP
        SET v_attempt = v_attempt + 1;
        IF v_attempt > 20 THEN
            SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'idemgate: the renewal of a key kept racing';
        END IF;
        SET v_found = TRUE, v_code = NULL;
        START TRANSACTION;
        SELECT kind, token, expires_at, issued INTO r_kind, r_token, r_expires, r_counted
          FROM {t} WHERE digest = p_digest FOR UPDATE;
        IF v_found AND r_kind = 'I' AND r_token = p_token THEN
            UPDATE {t} SET lease_until = v_lease, expires_at = v_expires
            WHERE digest = p_digest;
            IF r_counted THEN
                UPDATE {t}_seen SET expires_at = v_expires
                WHERE digest = p_digest AND expires_at = r_expires;
            END IF;
            SET v_code = 1;
        ELSEIF v_found AND r_expires > v_now THEN
            SET v_code = 0;
        ELSEIF v_found THEN
            UPDATE {t} SET kind = 'I', token = p_token, fingerprint = p_fp,
                created_at = v_now, lease_until = v_lease, expires_at = v_expires,
                lapse_hold = p_hold, issued = FALSE, status = NULL, response = NULL
            WHERE digest = p_digest;
            SET v_code = 2;
        ELSE
            INSERT IGNORE INTO {t} (digest, kind, token, fingerprint, created_at,
                                    lease_until, expires_at, lapse_hold)
            VALUES (p_digest, 'I', p_token, p_fp, v_now, v_lease, v_expires, p_hold);
            IF ROW_COUNT() = 1 THEN
                SET v_code = 2;
            END IF;
        END IF;
        COMMIT;
        IF v_code IS NOT NULL THEN
            SELECT v_code AS code;
            LEAVE renew;
        END IF;
    END LOOP;
END
-- ;;
-- An operator's purge: deletes a key's record and its observe-mode count, unless the
-- record is a claim in flight (its lease runs, or it lapsed on a route that releases
-- lapsed claims, whose takeover waits for the row to expire), or, with p_state, another
-- record than the one the operator looked at: the state shown (a lapsed claim held as
-- unknown shows as 'U'), the claim's token and created_at in ms, as the inspection reads
-- them. A lapsed claim held as unknown is an unknown outcome and is deleted. The look
-- locks the row, so no claim can take the key between the decision and the delete.
-- Returns 1 (deleted), 2 (a claim in flight, left alone), 3 (another record, left alone)
-- or 0 (no live record).
-- v2: deletes only the record named, when one is.
CREATE PROCEDURE IF NOT EXISTS {t}_purge_v2(
    IN p_digest BINARY(32), IN p_state CHAR(1) CHARACTER SET ascii, IN p_token BINARY(16),
    IN p_created_ms BIGINT)
BEGIN
    DECLARE v_now DATETIME(3) DEFAULT UTC_TIMESTAMP(3);
    DECLARE v_found BOOLEAN DEFAULT TRUE;
    DECLARE v_code INT DEFAULT 1;
    DECLARE r_kind CHAR(1) CHARACTER SET ascii;
    DECLARE r_token BINARY(16);
    DECLARE r_created DATETIME(3);
    DECLARE r_lease DATETIME(3);
    DECLARE r_hold BOOLEAN;
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_found = FALSE;
    DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
    START TRANSACTION;
    SELECT kind, token, created_at, lease_until, lapse_hold
      INTO r_kind, r_token, r_created, r_lease, r_hold
      FROM {t} WHERE digest = p_digest AND expires_at > v_now FOR UPDATE;
    IF NOT v_found THEN
        SET v_code = 0;
    ELSEIF r_kind = 'I' AND (r_lease > v_now OR NOT r_hold) THEN
        SET v_code = 2;
    ELSEIF p_state IS NOT NULL AND (
            IF(r_kind = 'I', 'U', r_kind) <> p_state
            OR NOT (r_token <=> p_token)
            OR CAST(TIMESTAMPDIFF(MICROSECOND, '1970-01-01', r_created) DIV 1000 AS SIGNED)
                <> p_created_ms) THEN
        SET v_code = 3;
    ELSE
        DELETE FROM {t} WHERE digest = p_digest;
        DELETE FROM {t}_seen WHERE digest = p_digest;
    END IF;
    COMMIT;
    SELECT v_code AS code;
END
-- ;;
-- Counts a hit in the key's current window, starting a new window when it ended.
CREATE PROCEDURE IF NOT EXISTS {t}_hit_v1(IN p_digest BINARY(32), IN p_window_ms BIGINT)
BEGIN
    DECLARE v_now DATETIME(3) DEFAULT UTC_TIMESTAMP(3);
    DECLARE v_hits BIGINT;
    DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
    START TRANSACTION;
    -- The assignments run in order: `hits` is the new count when `window_end` is set.
    INSERT INTO {t}_hits (digest, window_end, hits)
    VALUES (p_digest, v_now + INTERVAL p_window_ms * 1000 MICROSECOND, 1)
    ON DUPLICATE KEY UPDATE
        hits = IF(window_end <= v_now, 1, hits + 1),
        window_end = IF(hits = 1, v_now + INTERVAL p_window_ms * 1000 MICROSECOND, window_end);
    SELECT hits INTO v_hits FROM {t}_hits WHERE digest = p_digest;
    COMMIT;
    SELECT v_hits AS hits;
END
-- ;;
-- Counts a duplicate seen in observe mode while the key has a record (the first request
-- counts as one), and marks a claim in flight as counted so that its renewals and its
-- settlement keep the count. The row is locked first: a settlement running meanwhile
-- either comes after (and finds the mark and the count) or before (and the count takes
-- the settlement's expiry). Returns one row: when the record was made (Unix ms; NULL for
-- no record, or an issued token, which has no request yet).
CREATE PROCEDURE IF NOT EXISTS {t}_seen_v1(IN p_digest BINARY(32))
BEGIN
    DECLARE v_now DATETIME(3) DEFAULT UTC_TIMESTAMP(3);
    DECLARE v_found BOOLEAN DEFAULT TRUE;
    DECLARE r_kind CHAR(1) CHARACTER SET ascii;
    DECLARE r_counted BOOLEAN;
    DECLARE r_created DATETIME(3);
    DECLARE r_expires DATETIME(3);
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_found = FALSE;
    DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
    START TRANSACTION;
    SELECT kind, issued, created_at, expires_at INTO r_kind, r_counted, r_created, r_expires
      FROM {t} WHERE digest = p_digest AND expires_at > v_now FOR UPDATE;
    IF v_found THEN
        IF r_kind = 'I' AND NOT r_counted THEN
            UPDATE {t} SET issued = TRUE WHERE digest = p_digest;
        END IF;
        -- The assignments run in order: `times` compares the old `expires_at`.
        INSERT INTO {t}_seen (digest, times, last_at, expires_at)
        VALUES (p_digest, 2, v_now, r_expires)
        ON DUPLICATE KEY UPDATE
            times = IF(expires_at = VALUES(expires_at), times + 1, 2),
            last_at = VALUES(last_at), expires_at = VALUES(expires_at);
    END IF;
    COMMIT;
    SELECT IF(v_found AND r_kind <> 'T',
              CAST(TIMESTAMPDIFF(MICROSECOND, '1970-01-01', r_created) DIV 1000 AS SIGNED),
              NULL) AS made_ms;
END
