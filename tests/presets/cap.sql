-- .NET CAP 10.0.1 (NuGet DotNetCore.CAP.PostgreSql): the received and published tables of
-- src/DotNetCore.CAP.PostgreSql/IStorageInitializer.PostgreSql.cs (CreateDbTablesScript),
-- created in the test's schema instead of "cap" (CapOptions.Schema); the lock table
-- (UseStorageLock) is not watched and left out.
CREATE TABLE IF NOT EXISTS received(
	"Id" BIGINT PRIMARY KEY NOT NULL,
    "Version" VARCHAR(20) NOT NULL,
	"Name" VARCHAR(200) NOT NULL,
	"Group" VARCHAR(200) NULL,
	"Content" TEXT NULL,
	"Retries" INT NOT NULL,
	"Added" TIMESTAMP NOT NULL,
    "ExpiresAt" TIMESTAMP NULL,
	"StatusName" VARCHAR(50) NOT NULL
);

CREATE INDEX IF NOT EXISTS "idx_received_ExpiresAt_StatusName" ON received ("ExpiresAt","StatusName");
CREATE INDEX IF NOT EXISTS "idx_received_Version_ExpiresAt_StatusName" ON received ("Version","ExpiresAt","StatusName");

CREATE TABLE IF NOT EXISTS published(
	"Id" BIGINT PRIMARY KEY NOT NULL,
    "Version" VARCHAR(20) NOT NULL,
	"Name" VARCHAR(200) NOT NULL,
	"Content" TEXT NULL,
	"Retries" INT NOT NULL,
	"Added" TIMESTAMP NOT NULL,
    "ExpiresAt" TIMESTAMP NULL,
	"StatusName" VARCHAR(50) NOT NULL
);

CREATE INDEX IF NOT EXISTS "idx_published_ExpiresAt_StatusName" ON published("ExpiresAt","StatusName");
CREATE INDEX IF NOT EXISTS "idx_published_Version_ExpiresAt_StatusName" ON published ("Version","ExpiresAt","StatusName");
