-- solid_queue 1.5.0 (RubyGems `solid_queue`): the tables a job passes through, from
-- lib/generators/solid_queue/install/templates/db/queue_schema.rb as Rails 7.1+ writes them
-- for PostgreSQL (t.string = character varying, t.datetime = timestamp(6) without time zone,
-- create_table = bigserial id). The pause, process, recurring and semaphore tables are
-- not watched and left out.
CREATE TABLE solid_queue_jobs (
  id bigserial PRIMARY KEY,
  queue_name character varying NOT NULL,
  class_name character varying NOT NULL,
  arguments text,
  priority integer DEFAULT 0 NOT NULL,
  active_job_id character varying,
  scheduled_at timestamp(6) without time zone,
  finished_at timestamp(6) without time zone,
  concurrency_key character varying,
  created_at timestamp(6) without time zone NOT NULL,
  updated_at timestamp(6) without time zone NOT NULL
);
CREATE INDEX index_solid_queue_jobs_on_active_job_id ON solid_queue_jobs (active_job_id);
CREATE INDEX index_solid_queue_jobs_on_class_name ON solid_queue_jobs (class_name);
CREATE INDEX index_solid_queue_jobs_on_finished_at ON solid_queue_jobs (finished_at);
CREATE INDEX index_solid_queue_jobs_for_filtering ON solid_queue_jobs (queue_name, finished_at);
CREATE INDEX index_solid_queue_jobs_for_alerting ON solid_queue_jobs (scheduled_at, finished_at);

CREATE TABLE solid_queue_ready_executions (
  id bigserial PRIMARY KEY,
  job_id bigint NOT NULL REFERENCES solid_queue_jobs (id) ON DELETE CASCADE,
  queue_name character varying NOT NULL,
  priority integer DEFAULT 0 NOT NULL,
  created_at timestamp(6) without time zone NOT NULL
);
CREATE UNIQUE INDEX index_solid_queue_ready_executions_on_job_id ON solid_queue_ready_executions (job_id);

CREATE TABLE solid_queue_scheduled_executions (
  id bigserial PRIMARY KEY,
  job_id bigint NOT NULL REFERENCES solid_queue_jobs (id) ON DELETE CASCADE,
  queue_name character varying NOT NULL,
  priority integer DEFAULT 0 NOT NULL,
  scheduled_at timestamp(6) without time zone NOT NULL,
  created_at timestamp(6) without time zone NOT NULL
);
CREATE UNIQUE INDEX index_solid_queue_scheduled_executions_on_job_id ON solid_queue_scheduled_executions (job_id);

CREATE TABLE solid_queue_claimed_executions (
  id bigserial PRIMARY KEY,
  job_id bigint NOT NULL REFERENCES solid_queue_jobs (id) ON DELETE CASCADE,
  process_id bigint,
  created_at timestamp(6) without time zone NOT NULL
);
CREATE UNIQUE INDEX index_solid_queue_claimed_executions_on_job_id ON solid_queue_claimed_executions (job_id);

CREATE TABLE solid_queue_failed_executions (
  id bigserial PRIMARY KEY,
  job_id bigint NOT NULL REFERENCES solid_queue_jobs (id) ON DELETE CASCADE,
  error text,
  created_at timestamp(6) without time zone NOT NULL
);
CREATE UNIQUE INDEX index_solid_queue_failed_executions_on_job_id ON solid_queue_failed_executions (job_id);
