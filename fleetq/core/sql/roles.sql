-- fleetq logins (migration 0007): who may act as which runner or identity.

-- name: roles_exists
-- $1 role name
SELECT 1 FROM pg_roles WHERE rolname = $1::text;

-- name: roles_add
-- $1 role name, $2 kind, $3 subject (runner id or identity)
INSERT INTO fleetq.logins (role_name, kind, subject) VALUES ($1::text, $2::text, $3::text)
RETURNING created_at;

-- name: roles_remove
-- $1 role name
DELETE FROM fleetq.logins WHERE role_name = $1::text RETURNING role_name;

-- name: roles_list
SELECT role_name, kind, subject, created_at FROM fleetq.logins ORDER BY kind, role_name;

-- name: roles_database
-- The database a login is added to: it is granted CONNECT there (a database may keep it
-- from PUBLIC, as the demo's does).
SELECT current_database() AS name;
