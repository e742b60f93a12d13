-- Outcomes and the claim that refills their room in one transaction (issue 18):
-- fleetq.complete_and_claim (protocol/leases.sql), for runners.

INSERT INTO fleetq.grants (privilege, object, grantee)
VALUES ('EXECUTE',
        'FUNCTION fleetq.complete_and_claim(text, bigint[], bigint[], text[], integer[], '
        'text[], text[], integer[], integer[], integer[], text, integer, uuid)',
        'fleetq_runner');
