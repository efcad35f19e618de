// The browser tests' view of the official SDK: everything they use, on window.
import { OpenAIRealtimeWebRTC, RealtimeAgent, RealtimeSession } from '@openai/agents-realtime';

window.AgentsRealtime = { OpenAIRealtimeWebRTC, RealtimeAgent, RealtimeSession };
