-- Generated from sentin8/sources/grants.py: edit that file, then
--   python -m sentin8.sources.grants > sql/grants.sql
-- The role itself (LOGIN, password or certificate) is created by the DBA: CREATE ROLE sentin8_proxy LOGIN;
GRANT USAGE ON SCHEMA sys TO sentin8_proxy;
GRANT SELECT (id, slug, state) ON sys.orgs TO sentin8_proxy;
GRANT SELECT (id, org_id, slug, state) ON sys.envs TO sentin8_proxy;
GRANT SELECT (id, env_id, app_slug, service, custom_domains, state) ON sys.app_instances TO sentin8_proxy;
GRANT SELECT (name, service, hostname, state) ON sys.vertical_services TO sentin8_proxy;
