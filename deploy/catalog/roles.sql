-- The shared catalog's table and its least-privilege roles (docs/deploy.md, "The shared
-- catalog: PostgreSQL"). Run once per catalog database, as a superuser or the database's
-- owner with CREATEROLE, connected to that database; running it again changes nothing:
--
--   psql "postgresql://ADMIN@catalog.region-a.example.internal:5432/strata?sslmode=verify-full&sslrootcert=catalog-ca.crt" \
--        -v ON_ERROR_STOP=1 -f deploy/catalog/roles.sql
--   psql ... -c '\password strata_serve' -c '\password strata_publish'
--
-- Roles:
--   strata_owner    NOLOGIN: owns the table; nothing connects as it, so no hub
--                   credential can drop or alter the table or turn its policies off.
--   strata_publish  LOGIN: publish, tag, untag, revoke, gc, migrate (read and write
--                   every record of the catalog).
--   strata_serve    LOGIN: the serve replicas. Reads every record; writes only the three
--                   records a replica's start may record in the `meta` database (db 0):
--                   the format stamp and the blob store's location when the catalog has
--                   none yet, and the id of the key read grants are signed with (the
--                   first replica records it, `serve --rotate-grant-key` replaces it).
--                   Any other write (a publish, tag, revoke or gc as this role) is
--                   refused by the row-level security policies below.
--
-- The table is the one hub/catalog/postgres.py creates (tests/deploy/test_catalog_roles.py
-- checks that both are the same): made here so that its owner is strata_owner, not the
-- first hub process that reached the database.

BEGIN;

DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'strata_owner') THEN
        CREATE ROLE strata_owner NOLOGIN;
    END IF;
    -- connection limits: a process pools at most 8 connections and opens 1 more to probe
    -- (POOL_SIZE in hub/catalog/postgres.py); 64 is 7 replicas, 32 is 3 publishes or gcs
    -- at once. Raise them with the replica count (ALTER ROLE ... CONNECTION LIMIT).
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'strata_publish') THEN
        CREATE ROLE strata_publish LOGIN CONNECTION LIMIT 32;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'strata_serve') THEN
        CREATE ROLE strata_serve LOGIN CONNECTION LIMIT 64;
    END IF;
    -- only these roles reach this database (PUBLIC's CONNECT and TEMPORARY revoked)
    EXECUTE format('REVOKE ALL ON DATABASE %I FROM PUBLIC', current_database());
    EXECUTE format(
        'GRANT CONNECT ON DATABASE %I TO strata_publish, strata_serve', current_database()
    );
END
$$;

-- PostgreSQL 15 and later already refuse CREATE in public to PUBLIC; older ones did not
REVOKE CREATE ON SCHEMA public FROM PUBLIC;

CREATE TABLE IF NOT EXISTS public.strata_kv (
    db smallint NOT NULL,
    k bytea NOT NULL,
    v bytea NOT NULL,
    PRIMARY KEY (db, k)
);
ALTER TABLE public.strata_kv OWNER TO strata_owner;
REVOKE ALL ON public.strata_kv FROM PUBLIC;
GRANT SELECT, INSERT, UPDATE, DELETE ON public.strata_kv TO strata_publish;
GRANT SELECT, INSERT, UPDATE ON public.strata_kv TO strata_serve;

-- Row-level security: what each role's statements may see and change. The owner is exempt
-- (it never connects); every other role, without a policy, sees no row at all.
ALTER TABLE public.strata_kv ENABLE ROW LEVEL SECURITY;

DROP POLICY IF EXISTS strata_publish_all ON public.strata_kv;
CREATE POLICY strata_publish_all ON public.strata_kv
    FOR ALL TO strata_publish USING (true) WITH CHECK (true);

DROP POLICY IF EXISTS strata_serve_read ON public.strata_kv;
CREATE POLICY strata_serve_read ON public.strata_kv
    FOR SELECT TO strata_serve USING (true);

-- meta (db 0): format (hub/catalog/env.py check_format), blobs (set_blobs_location),
-- grant_key_id (set_grant_key); keys are hub/catalog/schema.py's META_* constants
DROP POLICY IF EXISTS strata_serve_start ON public.strata_kv;
CREATE POLICY strata_serve_start ON public.strata_kv
    FOR INSERT TO strata_serve
    WITH CHECK (db = 0 AND k IN ('format'::bytea, 'blobs'::bytea, 'grant_key_id'::bytea));

DROP POLICY IF EXISTS strata_serve_grant_key ON public.strata_kv;
CREATE POLICY strata_serve_grant_key ON public.strata_kv
    FOR UPDATE TO strata_serve
    USING (db = 0 AND k = 'grant_key_id'::bytea)
    WITH CHECK (db = 0 AND k = 'grant_key_id'::bytea);

COMMIT;
