-- good_job 4.19.2 (RubyGems `good_job`): the good_jobs and good_job_executions tables
-- of lib/generators/good_job/templates/install/migrations/create_good_jobs.rb.erb, as
-- Rails 7.1+ writes them for PostgreSQL (t.datetime = timestamp(6) without time zone,
-- t.timestamps = created_at/updated_at NOT NULL, id: :uuid = gen_random_uuid()), with the
-- migration's indexes on good_jobs that the agent's reads can use.
CREATE TABLE good_jobs (
  id uuid DEFAULT gen_random_uuid() NOT NULL PRIMARY KEY,
  queue_name text,
  priority integer,
  serialized_params jsonb,
  scheduled_at timestamp(6) without time zone,
  performed_at timestamp(6) without time zone,
  finished_at timestamp(6) without time zone,
  error text,
  created_at timestamp(6) without time zone NOT NULL,
  updated_at timestamp(6) without time zone NOT NULL,
  active_job_id uuid,
  concurrency_key text,
  cron_key text,
  retried_good_job_id uuid,
  cron_at timestamp(6) without time zone,
  batch_id uuid,
  batch_callback_id uuid,
  is_discrete boolean,
  executions_count integer,
  job_class text,
  error_event smallint,
  labels text[],
  locked_by_id uuid,
  locked_at timestamp(6) without time zone,
  lock_type smallint
);

CREATE TABLE good_job_executions (
  id uuid DEFAULT gen_random_uuid() NOT NULL PRIMARY KEY,
  created_at timestamp(6) without time zone NOT NULL,
  updated_at timestamp(6) without time zone NOT NULL,
  active_job_id uuid NOT NULL,
  job_class text,
  queue_name text,
  serialized_params jsonb,
  scheduled_at timestamp(6) without time zone,
  finished_at timestamp(6) without time zone,
  error text,
  error_event smallint,
  error_backtrace text[],
  process_id uuid,
  duration interval
);

CREATE INDEX index_good_jobs_on_scheduled_at ON good_jobs (scheduled_at) WHERE (finished_at IS NULL);
CREATE INDEX index_good_jobs_on_active_job_id_and_created_at ON good_jobs (active_job_id, created_at);
CREATE INDEX index_good_jobs_jobs_on_finished_at_only ON good_jobs (finished_at) WHERE finished_at IS NOT NULL;
CREATE INDEX index_good_jobs_on_job_class ON good_jobs (job_class);
CREATE INDEX index_good_jobs_on_created_at ON good_jobs (created_at);
CREATE INDEX index_good_jobs_on_unfinished_or_errored ON good_jobs (id) WHERE finished_at IS NULL OR error IS NOT NULL;
CREATE INDEX index_good_job_executions_on_active_job_id_and_created_at ON good_job_executions (active_job_id, created_at);
